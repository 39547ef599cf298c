#include "graph/params.hpp"

#include <sstream>

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
ParamSpec float_list_param(std::string name, std::vector<double> default_value, std::string doc) {
  return {std::move(name), ParamType::kFloatList, std::move(default_value), std::move(doc)};
}

std::vector<ParamSpec> join_params(std::vector<std::vector<ParamSpec>> groups) {
  std::vector<ParamSpec> joined;
  for (std::vector<ParamSpec>& group : groups) {
    for (ParamSpec& spec : group) joined.push_back(std::move(spec));
  }
  return joined;
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
