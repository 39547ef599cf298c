#pragma once

#include <concepts>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "graph/error.hpp"
#include "graph/params.hpp"

namespace flowtrain {

/// What an option declares beyond its name, doc and type (the type is its field's C++ type).
struct OptionRule {
  std::optional<double> min = std::nullopt;  // inclusive; unsigned fields default to 0
  std::optional<double> max = std::nullopt;  // inclusive
  std::vector<std::string> choices = {};     // the allowed values of a string
  /// For a std::string field: kString, kPath (must exist when given) or kOutputPath; for a
  /// std::vector<double> field, kIntList when it holds whole numbers (kFloatList otherwise).
  ParamType type = ParamType::kString;
  /// The option's name before it was renamed: a config may still spell it so.
  const char* former_name = "";
};

/// One spelling of an enum option's value in a config.
template <class E>
struct EnumName {
  E value;
  const char* name;
};

/// An enum whose values a config spells by name: `enum_names(E)`, declared beside the enum and
/// found by argument-dependent lookup, lists them (a value may have several names, the first
/// one is how it is written back):
///
///   enum class Distillation { kSoft, kHard };
///   inline std::span<const EnumName<Distillation>> enum_names(Distillation) {
///     static constexpr EnumName<Distillation> names[] = {{Distillation::kSoft, "soft"},
///                                                        {Distillation::kHard, "hard"}};
///     return names;
///   }
template <class E>
concept NamedEnum = std::is_enum_v<E> && requires(E e) {
  { enum_names(e) } -> std::convertible_to<std::span<const EnumName<E>>>;
};

/// The name a config gives `value`.
template <NamedEnum E>
const char* enum_name(E value) {
  for (const EnumName<E>& n : enum_names(E{})) {
    if (n.value == value) return n.name;
  }
  return "?";
}

/// The value a config names `name`; throws Error naming `what` and the names allowed.
template <NamedEnum E>
E enum_value(const std::string& name, const std::string& what) {
  std::string all;
  for (const EnumName<E>& n : enum_names(E{})) {
    if (name == n.name) return n.value;
    all += (all.empty() ? "" : ", ") + std::string(n.name);
  }
  throw Error(what + " must be one of " + all + ", got '" + name + "'");
}

/// A stage's typed options: one struct whose fields are its declared params, so YAML
/// validation, `flowtrain stages`, docs/config.md and C++ read one declaration, and a
/// misspelled option fails to compile. Fields are integers, floating point, bool, std::string,
/// std::vector<double> or a NamedEnum (parsed once, when the config is read: a config naming
/// another value is refused with the names allowed), with their defaults; `declare` names each
/// one:
///
///   struct SpinOptions {
///     std::int64_t rounds = 20000;
///     template <class Declare>
///     void declare(Declare& d) {
///       d(rounds, "rounds", "mixing rounds per item", {.min = 0});
///     }
///   };
///   class SpinStage final : public Map<std::uint64_t, std::uint64_t> {
///    public:
///     using Options = SpinOptions;
///     explicit SpinStage(const Options& options);
///     static StageDoc describe() { return {"CPU work per item", option_specs<Options>()}; }
///   ...
///   pipeline.add<SpinStage>("spin", {.rounds = 500}, {.concurrency = 2});
///
/// A group of options shared by several stages is a struct of its own, a field of theirs,
/// declared by `group.declare(d)` (its keys stay flat in YAML).
/// The options of a stage that has none.
struct NoOptions {
  template <class Declare>
  void declare(Declare&) {}
};

namespace detail {
template <class T>
inline constexpr bool kAlwaysFalse = false;

template <class T>
ParamType option_type(const OptionRule& rule) {
  if constexpr (std::is_same_v<T, bool>) {
    return ParamType::kBool;
  } else if constexpr (std::is_integral_v<T>) {
    return ParamType::kInt;
  } else if constexpr (std::is_floating_point_v<T>) {
    return ParamType::kFloat;
  } else if constexpr (std::is_same_v<T, std::string>) {
    return rule.type;
  } else if constexpr (NamedEnum<T>) {
    return ParamType::kString;
  } else if constexpr (std::is_same_v<T, std::vector<double>>) {
    return rule.type == ParamType::kIntList ? ParamType::kIntList : ParamType::kFloatList;
  } else {
    static_assert(kAlwaysFalse<T>,
                  "an option is an integer, floating point, bool, std::string, "
                  "std::vector<double> or a NamedEnum");
  }
}

template <class T>
ParamValue option_value(const T& v) {
  if constexpr (NamedEnum<T>) {
    return std::string(enum_name(v));
  } else if constexpr (std::is_same_v<T, bool>) {
    return v;
  } else if constexpr (std::is_integral_v<T>) {
    return static_cast<std::int64_t>(v);
  } else if constexpr (std::is_floating_point_v<T>) {
    return static_cast<double>(v);
  } else {
    return v;
  }
}

// The ParamSpecs of an options struct: each field's value in a default-constructed one is its
// default.
struct SpecCollector {
  std::vector<ParamSpec> specs;
  template <class T>
  void operator()(T& field, const char* name, const char* doc, const OptionRule& rule = {}) {
    ParamSpec spec{name,     option_type<T>(rule), option_value(field), doc, rule.min, rule.choices,
                   rule.max, rule.former_name};
    if constexpr (std::is_unsigned_v<T> && !std::is_same_v<T, bool>) {
      if (!spec.min) spec.min = 0;
    }
    if constexpr (NamedEnum<T>) {
      for (const EnumName<T>& n : enum_names(T{})) spec.choices.push_back(n.name);
    }
    specs.push_back(std::move(spec));
  }
};

struct ParamsWriter {
  std::map<std::string, ParamValue> values;
  template <class T>
  void operator()(T& field, const char* name, const char*, const OptionRule& = {}) {
    values[name] = option_value(field);
  }
};

struct ParamsReader {
  const Params& params;
  template <class T>
  void operator()(T& field, const char* name, const char*, const OptionRule& = {}) {
    if constexpr (NamedEnum<T>) {
      field = enum_value<T>(params.get_string(name), std::string("param '") + name + "'");
    } else if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, std::string> ||
                         std::is_same_v<T, std::vector<double>>) {
      field = params.get<T>(name);
    } else if constexpr (std::is_integral_v<T>) {
      field = static_cast<T>(params.get_int(name));
    } else {
      field = static_cast<T>(params.get_float(name));
    }
  }
};
}  // namespace detail

/// The declared params of options struct `O`, with its defaults.
template <class O>
std::vector<ParamSpec> option_specs() {
  // Made once: a default-constructed struct, read field by field.
  static const std::vector<ParamSpec> specs = [] {
    auto options = std::make_unique<O>();
    detail::SpecCollector collector;
    options->declare(collector);
    return collector.specs;
  }();
  return specs;
}

/// `O` filled from validated params (every declared name present, as a config gives them).
template <class O>
O options_from(const Params& params) {
  O options{};
  detail::ParamsReader reader{params};
  options.declare(reader);
  return options;
}

/// The params `options` sets, every declared name with its value.
template <class O>
Params to_params(O options) {
  detail::ParamsWriter writer;
  options.declare(writer);
  return Params(std::move(writer.values));
}

}  // namespace flowtrain
