// The Markdown and text docs of the registered stages and of an application's config sections.

#include <cstdio>

#include "graph/config.hpp"
#include "graph/config/suggest.hpp"

namespace flowtrain {

namespace {

using detail::choices_text;

// A Markdown table of declared values (`column` names the first column), or `none`.
std::string params_markdown(const std::vector<ParamSpec>& specs,
                            const std::string& column,
                            const std::string& none) {
  if (specs.empty()) return none + "\n\n";
  std::string out = "| " + column + " | type | default | meaning |\n|---|---|---|---|\n";
  for (const ParamSpec& p : specs) {
    std::string doc = p.doc;
    if (!p.choices.empty()) doc += choices_text(p);
    if (p.max) {
      char most[32];
      std::snprintf(most, sizeof most, " (at most %.10g)", *p.max);  // 0.99, 4096
      doc += most;
    }
    if (!p.former_name.empty()) doc += " (formerly `" + p.former_name + "`, which still loads)";
    out += "| `" + p.name + "` | " + to_string(p.type) + " | `" + p.default_text() + "` | " + doc +
           " |\n";
  }
  return out + "\n";
}

}  // namespace

std::string stages_markdown(const Registry& registry) {
  std::string out;
  for (const StageInfo* info : registry.all()) {
    out += "### `" + info->type + "`\n\n" + info->doc.summary + "\n\n";
    out += std::string("Kind: ") + to_string(info->shape.kind);
    if (!info->shape.input.is_none()) out += "; takes `" + info->shape.input.name() + "`";
    if (!info->shape.output.is_none()) out += "; emits `" + info->shape.output.name() + "`";
    out += ".\n\n";
    out += params_markdown(info->doc.params, "param", "No parameters.");
  }
  return out;
}

std::string sections_markdown(const std::vector<ConfigSection>& sections) {
  std::string out;
  for (const ConfigSection& section : sections) {
    out += "### `" + section.key + "`\n\n" + section.doc + "\n\n";
    out += params_markdown(section.params, "key", "No keys.");
  }
  return out;
}

std::string stages_text(const Registry& registry) {
  std::string out;
  for (const StageInfo* info : registry.all()) {
    out += info->type + "  (" + to_string(info->shape.kind);
    if (!info->shape.input.is_none()) out += ", takes " + info->shape.input.name();
    if (!info->shape.output.is_none()) out += ", emits " + info->shape.output.name();
    out += ")\n    " + info->doc.summary + "\n";
    for (const ParamSpec& p : info->doc.params) {
      char buf[128];
      std::snprintf(buf, sizeof buf, "    %-16s %-10s %-12s ", p.name.c_str(), to_string(p.type),
                    p.default_text().c_str());
      out += buf + p.doc + (p.choices.empty() ? "" : choices_text(p)) +
             (p.former_name.empty() ? "" : " (formerly " + p.former_name + ")") + "\n";
    }
    out += "\n";
  }
  return out;
}

}  // namespace flowtrain
