#pragma once

// The one CSV reader and writer: manifests, the food packages' tables, steps.csv, validation.csv
// and sweep.csv all go through it, so a path or value holding a comma or a quote round-trips.

#include <cstddef>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace flowtrain {

/// One record of a CSV text and the line it starts on (1-based).
struct CsvRow {
  std::size_t line = 0;
  std::vector<std::string> fields;
};

/// Parses CSV text as RFC 4180 does: a quoted field may hold commas, line breaks and "" for a
/// quote. A UTF-8 BOM, CRLF line ends and blank lines are accepted; unquoted fields are trimmed
/// of spaces and tabs. Throws Error("ORIGIN:LINE: column C: what") on an unterminated quote or
/// text after a closing quote.
///   for (const CsvRow& row : parse_csv(text, "train.csv")) use(row.fields);
std::vector<CsvRow> parse_csv(std::string_view text, const std::string& origin);

/// parse_csv of a file's content, with the path as origin. Throws Error naming the path if it
/// cannot be read.
std::vector<CsvRow> read_csv_file(const std::string& path);

/// `field` as written in CSV: quoted (quotes doubled) when it holds a comma, a quote, a line
/// break, a space or tab at either end, or starts with a UTF-8 byte-order mark; as is otherwise.
std::string csv_field(std::string_view field);

/// `value` as printf's `format` prints it ("%.6g", "%.3f"), for a numeric field.
///   csv_line({std::to_string(step), csv_number(loss), csv_number(seconds, "%.3f")});
std::string csv_number(double value, const char* format = "%.6g");

/// The fields through csv_field, joined by commas, ending in a newline.
///   text += csv_line({path, std::to_string(label)});
std::string csv_line(std::initializer_list<std::string_view> fields);
std::string csv_line(const std::vector<std::string>& fields);

}  // namespace flowtrain
