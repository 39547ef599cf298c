#include "graph/config/yaml_values.hpp"

#include <algorithm>

#include "graph/config/suggest.hpp"
#include "graph/stage.hpp"

namespace flowtrain::detail {

void check_keys(const YAML::Node& map,
                const std::vector<std::string>& allowed,
                const std::string& context,
                const Locator& loc) {
  for (auto it = map.begin(); it != map.end(); ++it) {
    const std::string key = it->first.as<std::string>();
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      loc.fail_key(it, context + "unknown key '" + key + "'" + suggestion(key, allowed));
    }
  }
}

std::string scalar_text(const YAML::Node& node) {
  if (node.IsScalar()) return "'" + node.Scalar() + "'";
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a map";
  return "nothing";
}

std::int64_t positive_int(const YAML::Node& node, const std::string& what, const Locator& loc) {
  std::int64_t v = 0;
  if (!scalar_as(node, v) || v < 1) {
    loc.fail(node, what + " must be a whole number >= 1, got " + scalar_text(node));
  }
  return v;
}

std::size_t parse_concurrency(const YAML::Node& node, const std::string& ctx, const Locator& loc) {
  if (node.IsScalar() && node.Scalar() == "serial") return kSerial;
  if (node.IsScalar() && node.Scalar() == "unlimited") return kUnlimited;
  std::int64_t v = 0;
  if (!scalar_as(node, v) || v < 1) {
    loc.fail(node, ctx + "concurrency must be 'serial', 'unlimited' or a whole number >= 1, got " +
                       scalar_text(node));
  }
  return static_cast<std::size_t>(v);
}

ParamValue parse_param(const ParamSpec& spec,
                       const YAML::Node& node,
                       const std::string& where,
                       const std::filesystem::path& base_dir,
                       const Locator& loc) {
  auto wrong = [&]() {
    loc.fail(node, where + "must be " + (spec.type == ParamType::kInt ? "an " : "a ") +
                       to_string(spec.type) + ", got " + scalar_text(node));
  };
  auto read = [&]() -> ParamValue {
    switch (spec.type) {
      case ParamType::kInt: {
        std::int64_t v = 0;
        if (!scalar_as(node, v)) wrong();
        return v;
      }
      case ParamType::kFloat: {
        double v = 0;
        if (!scalar_as(node, v)) wrong();
        return v;
      }
      case ParamType::kBool: {
        bool v = false;
        if (!scalar_as(node, v)) wrong();
        return v;
      }
      case ParamType::kString:
        if (!node.IsScalar()) wrong();
        return node.Scalar();
      case ParamType::kPath:
      case ParamType::kOutputPath: {
        if (!node.IsScalar()) wrong();
        std::filesystem::path p = node.Scalar();
        if (p.empty() || std::find(spec.choices.begin(), spec.choices.end(), p.string()) !=
                             spec.choices.end()) {
          return p.string();  // a choice (a preset's name), not a file
        }
        // Relative to the config file's folder; a path given on the command line, to the shell's.
        if (p.is_relative() && !base_dir.empty() && !loc.is_override(node)) p = base_dir / p;
        return p.lexically_normal().string();
      }
      case ParamType::kFloatList:
      case ParamType::kIntList: {
        if (!node.IsSequence()) wrong();
        std::vector<double> out;
        for (const YAML::Node& item : node) {
          double v = 0;
          if (!scalar_as(item, v)) wrong();
          out.push_back(v);
        }
        return out;
      }
    }
    throw Error(where + "has an unknown type");
  };
  ParamValue value = read();
  if (std::string problem = value_problem(spec, value); !problem.empty()) {
    loc.fail(node, where + problem);
  }
  return value;
}

}  // namespace flowtrain::detail
