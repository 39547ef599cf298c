#include "graph/config/suggest.hpp"

#include <algorithm>

namespace flowtrain::detail {

namespace {

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

std::string choices_text(const ParamSpec& p) {
  return " (one of: " + join(p.choices) + (p.type == ParamType::kPath ? ", or a file" : "") + ")";
}

std::string suggestion(const std::string& given, const std::vector<std::string>& candidates) {
  const std::string* best = nullptr;
  std::size_t best_distance = 0;
  for (const std::string& c : candidates) {
    const std::size_t d = edit_distance(given, c);
    if (!best || d < best_distance) {
      best = &c;
      best_distance = d;
    }
  }
  if (best && best_distance <= std::max<std::size_t>(2, given.size() / 3)) {
    return " (did you mean '" + *best + "'?)";
  }
  return candidates.empty() ? "" : " (known: " + join(candidates) + ")";
}

std::string stage_label(const std::string& name, const std::string& type) {
  return "stage '" + name + "' (" + type + "): ";
}

std::string phase_label(const std::string& name) {
  return name.empty() ? "" : "phase '" + name + "': ";
}

}  // namespace flowtrain::detail
