#pragma once

// Small text helpers of foodtag's data preparation.

#include <charconv>
#include <string>
#include <system_error>

namespace foodtag {

/// ASCII lower case.
inline std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  return s;
}

/// Without leading and trailing blanks (spaces, tabs, line ends).
inline std::string trim(std::string s) {
  const auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  while (!s.empty() && blank(s.back())) s.pop_back();
  std::size_t i = 0;
  while (i < s.size() && blank(s[i])) ++i;
  return s.substr(i);
}

/// `value` with one decimal ("12.5"), whatever the locale.
inline std::string fixed1(double value) {
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::fixed, 1);
  return ec == std::errc() ? std::string(buf, end) : std::string("nan");
}

}  // namespace foodtag
