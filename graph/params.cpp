#include "graph/params.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <sstream>
#include <type_traits>

#include "graph/error.hpp"

namespace flowtrain {

const char* to_string(ParamType type) {
  switch (type) {
    case ParamType::kInt:
      return "int";
    case ParamType::kFloat:
      return "float";
    case ParamType::kBool:
      return "bool";
    case ParamType::kString:
      return "string";
    case ParamType::kPath:
      return "path";
    case ParamType::kOutputPath:
      return "output path";
    case ParamType::kFloatList:
      return "float list";
    case ParamType::kIntList:
      return "int list";
  }
  return "?";
}

namespace {
std::string format_number(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}
}  // namespace

const ParamSpec* find_param(const std::vector<ParamSpec>& specs, const std::string& key) {
  for (const ParamSpec& spec : specs) {
    if (spec.name == key || (!spec.former_name.empty() && spec.former_name == key)) return &spec;
  }
  return nullptr;
}

std::string ParamSpec::default_text() const {
  struct Visitor {
    std::string operator()(std::int64_t v) const { return std::to_string(v); }
    std::string operator()(double v) const { return format_number(v); }
    std::string operator()(bool v) const { return v ? "true" : "false"; }
    std::string operator()(const std::string& v) const { return "\"" + v + "\""; }
    std::string operator()(const std::vector<double>& v) const {
      std::string out = "[";
      for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + format_number(v[i]);
      return out + "]";
    }
  };
  return std::visit(Visitor{}, default_value);
}

ParamSpec int_param(std::string name,
                    std::int64_t default_value,
                    std::string doc,
                    std::optional<double> min,
                    std::optional<double> max) {
  ParamSpec spec{std::move(name), ParamType::kInt, default_value, std::move(doc), min};
  spec.max = max;
  return spec;
}
ParamSpec float_param(std::string name,
                      double default_value,
                      std::string doc,
                      std::optional<double> min,
                      std::optional<double> max) {
  ParamSpec spec{std::move(name), ParamType::kFloat, default_value, std::move(doc), min};
  spec.max = max;
  return spec;
}
ParamSpec bool_param(std::string name, bool default_value, std::string doc) {
  return {std::move(name), ParamType::kBool, default_value, std::move(doc)};
}
ParamSpec string_param(std::string name,
                       std::string default_value,
                       std::string doc,
                       std::vector<std::string> choices) {
  return {std::move(name), ParamType::kString, std::move(default_value),
          std::move(doc),  std::nullopt,       std::move(choices)};
}
ParamSpec output_path_param(std::string name, std::string doc) {
  return {std::move(name), ParamType::kOutputPath, std::string(), std::move(doc)};
}

ParamSpec path_param(std::string name, std::string doc) {
  return {std::move(name), ParamType::kPath, std::string(), std::move(doc)};
}
std::string value_problem(const ParamSpec& spec, const ParamValue& value) {
  const bool right_type = std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        switch (spec.type) {
          case ParamType::kInt:
            return std::is_same_v<T, std::int64_t>;
          case ParamType::kFloat:
            return std::is_same_v<T, double>;
          case ParamType::kBool:
            return std::is_same_v<T, bool>;
          case ParamType::kFloatList:
          case ParamType::kIntList:
            return std::is_same_v<T, std::vector<double>>;
          default:
            return std::is_same_v<T, std::string>;
        }
      },
      value);
  if (!right_type) return std::string("must be a ") + to_string(spec.type);
  if (const auto* d = std::get_if<double>(&value); d && !std::isfinite(*d)) {
    return "must be a finite number, got " + format_number(*d);
  }
  if (const auto* list = std::get_if<std::vector<double>>(&value)) {
    for (const double d : *list) {
      if (!std::isfinite(d)) return "must hold finite numbers, got " + format_number(d);
      if (spec.type == ParamType::kIntList && d != std::floor(d)) {
        return "must hold whole numbers, got " + format_number(d);
      }
    }
  }
  if (spec.type == ParamType::kInt || spec.type == ParamType::kFloat) {
    const double v = spec.type == ParamType::kInt ? static_cast<double>(std::get<std::int64_t>(value))
                                                  : std::get<double>(value);
    const std::string got = ", got " + ParamSpec{"", spec.type, value, ""}.default_text();
    // Stages read ints as int: nothing above 2^31 - 1 may wrap into a negative.
    const std::optional<double> max =
        spec.type == ParamType::kInt
            ? spec.max.value_or(static_cast<double>(std::numeric_limits<std::int32_t>::max()))
            : spec.max;
    auto bound = [](double b) {  // whole bounds in full: 2147483647, not 2.14748e+09
      return std::floor(b) == b ? std::to_string(static_cast<long long>(b)) : format_number(b);
    };
    if (spec.min && v < *spec.min) return "must be >= " + bound(*spec.min) + got;
    if (max && v > *max) return "must be <= " + bound(*max) + got;
  }
  if (const auto* s = std::get_if<std::string>(&value)) {
    const bool chosen = !spec.choices.empty() && std::find(spec.choices.begin(), spec.choices.end(),
                                                           *s) != spec.choices.end();
    std::error_code ec;
    const bool missing = !s->empty() && !std::filesystem::exists(*s, ec);
    if (!spec.choices.empty() && !chosen && (spec.type != ParamType::kPath || missing)) {
      std::string all;
      for (const std::string& c : spec.choices) all += (all.empty() ? "" : ", ") + c;
      return "must be one of " + all + (spec.type == ParamType::kPath ? ", or a file that exists" : "") +
             ", got '" + *s + "'";
    }
    if (spec.type == ParamType::kPath && !chosen && missing) {
      return "names '" + *s + "', which does not exist";
    }
  }
  return {};
}

Params Params::defaults(const std::vector<ParamSpec>& specs) {
  Params params;
  for (const ParamSpec& spec : specs) params.set(spec.name, spec.default_value);
  return params;
}

const ParamValue& Params::at(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) throw Error("stage asked for undeclared param '" + name + "'");
  return it->second;
}

void Params::throw_type_error(const std::string& name) const {
  throw Error("stage read param '" + name + "' with a type other than the declared one");
}

}  // namespace flowtrain
