#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace flowtrain {

/// A parameter value as given in a config. Ints are int64, floats double.
using ParamValue = std::variant<std::int64_t, double, bool, std::string, std::vector<double>>;

enum class ParamType {
  kInt,
  kFloat,
  kBool,
  kString,
  kPath,        // a string naming a file or folder that must exist (empty = not given); with
                // choices, one of them or a file (a model: a preset's name or a file)
  kOutputPath,  // a file or folder the run writes, or an earlier phase wrote (need not exist)
  kFloatList,   // [0.485, 0.456, 0.406]
  kIntList,     // [2, 2, 2, 2]: whole numbers, held as a float list
};

const char* to_string(ParamType type);

/// One declared parameter of a stage: the single source for validation, `flowtrain stages`
/// and docs/config.md.
struct ParamSpec {
  std::string name;
  ParamType type = ParamType::kInt;
  ParamValue default_value;
  std::string doc;
  std::optional<double> min = std::nullopt;  // inclusive lower bound for numbers
  std::vector<std::string> choices = {};     // the allowed values of a string, if restricted
  /// Inclusive upper bound for numbers. An int without one is still refused above 2^31 - 1, so a
  /// value never wraps when a stage reads it as an int.
  std::optional<double> max = std::nullopt;
  /// The name the param had before it was renamed, which a config may still use (empty: none).
  std::string former_name = {};

  /// The default as a config would spell it ("0.5", "true", "[1, 2]", "\"\"").
  std::string default_text() const;
};

/// Helpers to declare the params of an application's config section tersely (a stage declares
/// its params as a typed options struct instead, graph/options.hpp):
///   {int_param("seed", 1, "seed of the split", 0), path_param("from", "photo folder")}
ParamSpec int_param(std::string name,
                    std::int64_t default_value,
                    std::string doc,
                    std::optional<double> min = std::nullopt,
                    std::optional<double> max = std::nullopt);
ParamSpec float_param(std::string name,
                      double default_value,
                      std::string doc,
                      std::optional<double> min = std::nullopt,
                      std::optional<double> max = std::nullopt);
ParamSpec bool_param(std::string name, bool default_value, std::string doc);
ParamSpec string_param(std::string name,
                       std::string default_value,
                       std::string doc,
                       std::vector<std::string> choices = {});
ParamSpec path_param(std::string name, std::string doc);
ParamSpec output_path_param(std::string name, std::string doc);

/// The spec in `specs` a config's `key` names: its name, or its former name. Null if none.
const ParamSpec* find_param(const std::vector<ParamSpec>& specs, const std::string& key);

/// Returns a one-line problem with `value` for `spec` ("must be >= 0, got -1"; the caller names
/// the param), else an empty string: the type, the bounds (ints also <= 2^31 - 1), the choices,
/// and that a kPath exists. One check for a config's values and for options set in C++.
std::string value_problem(const ParamSpec& spec, const ParamValue& value);

/// Validated parameters, by name: every declared name has a value of its declared type (the
/// default where the config gave none). The registry turns a stage's into its typed options
/// (options_from); an application reads its config sections from them.
class Params {
 public:
  Params() = default;
  explicit Params(std::map<std::string, ParamValue> values) : values_(std::move(values)) {}

  /// Typed read; throws Error if the stage asks for a name it did not declare or the wrong type
  /// (a programming error in the stage, not a user error).
  template <class T>
  T get(const std::string& name) const {
    const ParamValue& v = at(name);
    if (const T* p = std::get_if<T>(&v)) return *p;
    throw_type_error(name);
  }

  std::int64_t get_int(const std::string& name) const { return get<std::int64_t>(name); }
  double get_float(const std::string& name) const { return get<double>(name); }
  bool get_bool(const std::string& name) const { return get<bool>(name); }
  std::string get_string(const std::string& name) const { return get<std::string>(name); }

  void set(const std::string& name, ParamValue value) { values_[name] = std::move(value); }
  const std::map<std::string, ParamValue>& values() const { return values_; }

  /// The declared defaults, for building a stage from C++ without a config.
  static Params defaults(const std::vector<ParamSpec>& specs);

 private:
  const ParamValue& at(const std::string& name) const;
  [[noreturn]] void throw_type_error(const std::string& name) const;
  std::map<std::string, ParamValue> values_;
};

}  // namespace flowtrain
