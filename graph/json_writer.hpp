#pragma once

// JSON text for the files that scripts read (the run report, the Chrome trace), written without
// a JSON library.

#include <cstdint>
#include <string>
#include <string_view>

namespace flowtrain {

/// `text` as the inside of a JSON string (RFC 8259): `"` and `\` escaped, control characters as
/// \n, \t, \r, \b, \f or \u00XX. JSON text is UTF-8 and a file name need not be: a byte that
/// is not part of a valid UTF-8 sequence becomes \ufffd (the replacement character).
///   json_escape("say \"hi\"\n") == "say \\\"hi\\\"\\n"
std::string json_escape(std::string_view text);

/// Builds one JSON value as compact text (no spaces, no line breaks), placing the commas. The
/// caller keeps the structure valid: a key before each value of an object, none in an array.
/// A number is the shortest text that reads back as the same double (std::to_chars); JSON has
/// no inf or nan, so those are written as null.
///   JsonWriter json;
///   json.begin_object().key("loss").number(0.25).key("tags").begin_array().string("a");
///   json.end_array().key("best").number(NAN).end_object();
///   json.text() == R"({"loss":0.25,"tags":["a"],"best":null})"
class JsonWriter {
 public:
  JsonWriter& begin_object();
  JsonWriter& end_object();
  JsonWriter& begin_array();
  JsonWriter& end_array();
  /// The key of the next value, inside an object.
  JsonWriter& key(std::string_view name);
  JsonWriter& string(std::string_view value);
  JsonWriter& number(double value);
  JsonWriter& integer(std::uint64_t value);
  JsonWriter& boolean(bool value);
  JsonWriter& null();

  const std::string& text() const { return text_; }

 private:
  // Starts a value or a key: a comma first unless it is the first in its object or array.
  void separate();

  std::string text_;
  bool after_value_ = false;  // a value ended last: the next one needs a comma
};

}  // namespace flowtrain
