#include "graph/json_writer.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace flowtrain {

namespace {

// Length of the well-formed UTF-8 sequence that starts text[i] (a byte >= 0x80), or 0 where
// there is none: a stray continuation byte, an overlong form, a surrogate, a code point above
// U+10FFFF or a sequence cut short (the Unicode standard's table 3-7).
std::size_t utf8_length(std::string_view text, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  std::size_t length = 0;
  unsigned char low = 0x80, high = 0xBF;  // the range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;   // overlong below
    if (lead == 0xED) high = 0x9F;  // surrogates above
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;   // overlong below
    if (lead == 0xF4) high = 0x8F;  // past U+10FFFF above
  } else {
    return 0;
  }
  if (i + length > text.size() || byte(i + 1) < low || byte(i + 1) > high) return 0;
  for (std::size_t k = 2; k < length; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
  }
  return length;
}

}  // namespace

std::string json_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x80) {
      const std::size_t length = utf8_length(text, i);
      if (length == 0) {
        out += "\\ufffd";
        ++i;
      } else {
        out += text.substr(i, length);
        i += length;
      }
      continue;
    }
    // '"', '\\' and the control characters with a short escape; the letter after the backslash.
    static const char* const kShort = "\"\\\b\f\n\r\t";
    static const char* const kLetter = "\"\\bfnrt";
    if (const char* at = c != 0 ? std::strchr(kShort, c) : nullptr) {
      out += '\\';
      out += kLetter[at - kShort];
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
    ++i;
  }
  return out;
}

void JsonWriter::separate() {
  if (after_value_) text_ += ',';
  after_value_ = false;
}

JsonWriter& JsonWriter::begin_object() {
  separate();
  text_ += '{';
  return *this;
}

JsonWriter& JsonWriter::end_object() {
  text_ += '}';
  after_value_ = true;
  return *this;
}

JsonWriter& JsonWriter::begin_array() {
  separate();
  text_ += '[';
  return *this;
}

JsonWriter& JsonWriter::end_array() {
  text_ += ']';
  after_value_ = true;
  return *this;
}

JsonWriter& JsonWriter::key(std::string_view name) {
  separate();
  text_ += '"';
  text_ += json_escape(name);
  text_ += "\":";
  return *this;
}

JsonWriter& JsonWriter::string(std::string_view value) {
  separate();
  text_ += '"';
  text_ += json_escape(value);
  text_ += '"';
  after_value_ = true;
  return *this;
}

JsonWriter& JsonWriter::number(double value) {
  if (!std::isfinite(value)) return null();
  separate();
  char buf[32];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof buf, value);
  text_.append(buf, r.ptr);
  after_value_ = true;
  return *this;
}

JsonWriter& JsonWriter::integer(std::uint64_t value) {
  separate();
  text_ += std::to_string(value);
  after_value_ = true;
  return *this;
}

JsonWriter& JsonWriter::boolean(bool value) {
  separate();
  text_ += value ? "true" : "false";
  after_value_ = true;
  return *this;
}

JsonWriter& JsonWriter::null() {
  separate();
  text_ += "null";
  after_value_ = true;
  return *this;
}

}  // namespace flowtrain
