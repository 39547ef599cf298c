#include <algorithm>
#include <charconv>
#include <iostream>
#include <sstream>

#include "apps/foodtag/commands/command.hpp"

namespace foodtag {

std::string value_text(const flowtrain::ParamValue& value) {
  const auto number = [](double v) {
    char buf[64];
    const auto end = std::to_chars(buf, buf + sizeof buf, v).ptr;
    std::string text(buf, end);
    if (text.find_first_of(".en") == std::string::npos) text += ".0";
    return text;
  };
  if (const auto* v = std::get_if<std::int64_t>(&value)) return std::to_string(*v);
  if (const auto* v = std::get_if<double>(&value)) return number(*v);
  if (const auto* v = std::get_if<bool>(&value)) return *v ? "true" : "false";
  if (const auto* v = std::get_if<std::string>(&value)) return v->empty() ? "\"\"" : *v;
  std::string out;
  for (double v : std::get<std::vector<double>>(value)) {
    out += (out.empty() ? "" : ", ") + number(v);
  }
  return "[" + out + "]";
}

int config_command(const Context& ctx) {
  flowtrain::RunConfig config = load_phases(ctx.in.config_path, ctx.in.overrides);
  std::vector<std::string> names;
  for (const flowtrain::PipelineConfig& phase : config.phases) names.push_back(phase.name);
  const std::vector<std::string> run = derive_phases(config, names);
  std::ostringstream out;
  for (const flowtrain::PipelineConfig& phase : config.phases) {
    const auto [threads, cores] = flowtrain::threads_and_cores(phase.run);
    out << "phase " << phase.name << ": threads " << threads << ", cores " << cores;
    if (phase.run.sample_interval_ms != 2) out << ", sample_ms " << phase.run.sample_interval_ms;
    if (!phase.run.trace_path.empty()) out << ", trace " << phase.run.trace_path;
    if (!phase.run.drops_path.empty()) out << ", drops " << phase.run.drops_path;
    if (phase.run.autotune.enabled) out << ", autotune";
    if (std::find(run.begin(), run.end(), phase.name) == run.end()) out << " (not run)";
    out << "\n";
    for (const flowtrain::StageConfig& stage : phase.stages) {
      const flowtrain::StageOptions& o = stage.options;
      out << "  " << stage.name << ": " << stage.type;
      if (o.concurrency != flowtrain::kSerial) out << ", concurrency " << o.concurrency;
      if (o.queue_capacity != 8) out << ", queue_capacity " << o.queue_capacity;
      if (o.ordered) out << ", ordered";
      if (!o.inputs.empty()) {
        out << ", inputs [";
        for (std::size_t i = 0; i < o.inputs.size(); ++i) out << (i ? ", " : "") << o.inputs[i];
        out << "]";
      }
      if (!o.token_from.empty()) out << ", token_from " << o.token_from;
      if (stage.auto_threads) out << ", threads auto";
      out << "\n";
      for (const auto& [key, value] : stage.params.values()) {
        out << "    " << key << ": " << value_text(value) << "\n";
      }
    }
  }
  std::cout << out.str();
  return 0;
}

}  // namespace foodtag
