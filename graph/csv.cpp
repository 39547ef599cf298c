#include "graph/csv.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "graph/error.hpp"
#include "graph/read_file.hpp"

namespace flowtrain {

namespace {

bool is_blank(char c) { return c == ' ' || c == '\t'; }

std::string trimmed(std::string_view s) {
  while (!s.empty() && is_blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_blank(s.back())) s.remove_suffix(1);
  return std::string(s);
}

template <class Fields>
std::string join_line(const Fields& fields) {
  // One empty field alone would be a blank line, which reads as no record.
  if (std::size(fields) == 1 && std::begin(fields)->empty()) return "\"\"\n";
  std::string line;
  const char* separator = "";
  for (const std::string_view field : fields) {
    line += separator;
    line += csv_field(field);
    separator = ",";
  }
  return line + '\n';
}

}  // namespace

std::vector<CsvRow> parse_csv(std::string_view text, const std::string& origin) {
  if (text.starts_with("\xEF\xBB\xBF")) text.remove_prefix(3);
  std::vector<CsvRow> rows;
  CsvRow row{1, {}};
  std::size_t line = 1;
  std::size_t i = 0;
  const auto fail = [&](const std::string& what) {
    throw Error(origin + ":" + std::to_string(row.line) + ": column " +
                std::to_string(row.fields.size() + 1) + ": " + what);
  };
  const auto at_line_end = [&] { return i >= text.size() || text[i] == '\n' || text[i] == '\r'; };
  bool quoted = false;  // the record has a quoted field (so `""` alone is a record)
  while (i < text.size() || !row.fields.empty()) {
    // One field, starting at text[i].
    const std::size_t start = i;
    while (i < text.size() && is_blank(text[i])) ++i;
    if (i < text.size() && text[i] == '"') {
      quoted = true;
      std::string field;
      for (++i;; ++i) {
        if (i >= text.size()) fail("unterminated quote");
        if (text[i] == '"') {
          if (i + 1 < text.size() && text[i + 1] == '"') {
            field += '"';
            ++i;
            continue;
          }
          ++i;
          break;
        }
        line += text[i] == '\n';
        field += text[i];
      }
      while (i < text.size() && is_blank(text[i])) ++i;
      if (!at_line_end() && text[i] != ',') fail("text after a closing quote");
      row.fields.push_back(std::move(field));
    } else {
      i = start;
      while (!at_line_end() && text[i] != ',') ++i;
      row.fields.push_back(trimmed(text.substr(start, i - start)));
    }
    if (i < text.size() && text[i] == ',') {
      ++i;
      continue;
    }
    // The end of a record: a blank line (one empty unquoted field) is none.
    if (row.fields.size() > 1 || !row.fields.front().empty() || quoted) {
      rows.push_back(std::move(row));
    }
    quoted = false;
    if (i < text.size() && text[i] == '\r') ++i;
    if (i < text.size() && text[i] == '\n') ++i;
    ++line;
    row = CsvRow{line, {}};
  }
  return rows;
}

std::vector<CsvRow> read_csv_file(const std::string& path) {
  std::vector<std::uint8_t> buffer;
  std::span<const std::uint8_t> bytes;
  if (const std::string error = read_file(path, buffer, bytes); !error.empty()) {
    throw Error(path + ": cannot open (" + error + ")");
  }
  return parse_csv(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
                   path);
}

std::string csv_field(std::string_view field) {
  // A leading byte-order mark is quoted too: unquoted at the start of a file, a reader drops it.
  const bool quote = field.find_first_of(",\"\r\n") != std::string_view::npos ||
                     (!field.empty() && (is_blank(field.front()) || is_blank(field.back()))) ||
                     field.starts_with("\xEF\xBB\xBF");
  if (!quote) return std::string(field);
  std::string out = "\"";
  for (const char c : field) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + '"';
}

std::string csv_number(double value, const char* format) {
  char text[64];
  std::snprintf(text, sizeof text, format, value);
  return text;
}

std::string csv_line(std::initializer_list<std::string_view> fields) { return join_line(fields); }

std::string csv_line(const std::vector<std::string>& fields) { return join_line(fields); }

}  // namespace flowtrain
