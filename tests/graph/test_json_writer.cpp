#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "graph/json_writer.hpp"

using namespace flowtrain;

TEST_CASE("Json.Escape.QuotesBackslashesAndControlCharacters") {
  CHECK(json_escape("say \"hi\"\n") == "say \\\"hi\\\"\\n");
  CHECK(json_escape("C:\\data\\") == "C:\\\\data\\\\");
  CHECK(json_escape("\b\f\n\r\t") == "\\b\\f\\n\\r\\t");
  CHECK(json_escape(std::string("\0\x01\x1f", 3)) == "\\u0000\\u0001\\u001f");
  CHECK(json_escape("/ ' \x7f ~") == "/ ' \x7f ~");  // none of these needs escaping
}

TEST_CASE("Json.Escape.Utf8KeptInvalidBytesReplaced") {
  // Two, three and four bytes (é, €, 𝄞) pass as they are.
  CHECK(json_escape("\xc3\xa9 \xe2\x82\xac \xf0\x9d\x84\x9e") ==
        "\xc3\xa9 \xe2\x82\xac \xf0\x9d\x84\x9e");
  // A Latin-1 file name, a stray continuation byte, an overlong '/', a surrogate, a code point
  // above U+10FFFF and a sequence cut short: each byte that is no part of a valid one is U+FFFD.
  CHECK(json_escape("caf\xe9.jpg") == "caf\\ufffd.jpg");
  CHECK(json_escape("\x80") == "\\ufffd");
  CHECK(json_escape("\xc0\xaf") == "\\ufffd\\ufffd");
  CHECK(json_escape("\xed\xa0\x80") == "\\ufffd\\ufffd\\ufffd");
  CHECK(json_escape("\xf4\x90\x80\x80") == "\\ufffd\\ufffd\\ufffd\\ufffd");
  CHECK(json_escape("\xe2\x82") == "\\ufffd\\ufffd");
}

TEST_CASE("Json.Writer.CommasNestingAndValues") {
  JsonWriter json;
  json.begin_object().key("a").begin_array().end_array().key("b").begin_object().end_object();
  json.key("c").begin_array().integer(1).begin_array().boolean(true).null().end_array();
  json.begin_object().key("k\"").string("v\n").end_object().boolean(false).end_array();
  json.end_object();
  CHECK(json.text() == R"({"a":[],"b":{},"c":[1,[true,null],{"k\"":"v\n"},false]})");
}

TEST_CASE("Json.Writer.NumbersShortestRoundTripNoInfOrNan") {
  const auto text = [](double v) { return JsonWriter().number(v).text(); };
  CHECK(text(0.1 + 0.2) == "0.30000000000000004");
  CHECK(text(0.25) == "0.25");
  CHECK(text(6) == "6");
  CHECK(text(-0.0) == "-0");
  CHECK(text(1e300) == "1e+300");
  CHECK(text(5e-324) == "5e-324");
  CHECK(text(std::numeric_limits<double>::infinity()) == "null");
  CHECK(text(-std::numeric_limits<double>::infinity()) == "null");
  CHECK(text(std::numeric_limits<double>::quiet_NaN()) == "null");
  CHECK(JsonWriter().integer(std::numeric_limits<std::uint64_t>::max()).text() ==
        "18446744073709551615");
}
