#include "graph/config/expand.hpp"

#include <optional>

#include "graph/checks.hpp"
#include "graph/config/suggest.hpp"
#include "graph/error.hpp"
#include "graph/names.hpp"

namespace flowtrain {

namespace detail {

const StageInfo& registered(const StageConfig& stage, const Registry& registry) {
  const StageInfo* info = registry.find(stage.type);
  if (!info) throw Error(stage.location + ": unknown stage type '" + stage.type + "'");
  return *info;
}

std::string entry_output(const PipelineConfig& config, const Registry& registry, const std::string& name) {
  for (const StageConfig& entry : config.stages) {
    if (entry.name != name) continue;
    const StageInfo& info = registered(entry, registry);
    std::string output = name;
    if (info.expand) {
      for (const ExpandedNode& node : info.expand(entry.params, config.run)) {
        if (node.always) output = node_name(name, node.node);
      }
    }
    return output;
  }
  return name;
}

}  // namespace detail

namespace {

using detail::entry_output;
using detail::phase_label;
using detail::registered;

// True if an entry after `i` takes its output: names it (or one of its outputs) as an input, or
// follows it with no inputs named.
bool consumed(const std::vector<StageConfig>& stages, std::size_t i, const Registry& registry) {
  const std::string& name = stages[i].name;
  for (std::size_t j = i + 1; j < stages.size(); ++j) {
    const std::vector<std::string> inputs = effective_inputs(
        stages[j].options.inputs, registered(stages[j], registry).shape.kind, stages[j - 1].name);
    for (const std::string& input : inputs) {
      if (input == name || input.rfind(name + ".", 0) == 0) return true;
    }
  }
  return false;
}

}  // namespace

std::vector<StageConfig> expanded_stages(const PipelineConfig& config, const Registry& registry) {
  std::vector<StageConfig> out;
  for (std::size_t i = 0; i < config.stages.size(); ++i) {
    const StageConfig& entry = config.stages[i];
    out.push_back(entry);
    for (std::string& input : out.back().options.inputs) {
      input = entry_output(config, registry, input);
    }
    const StageInfo& info = registered(entry, registry);
    if (!info.expand) continue;
    const std::size_t entry_at = out.size() - 1;
    const bool consumed_by_entries = consumed(config.stages, i, registry);
    const std::string output = entry_output(config, registry, entry.name);
    for (ExpandedNode& node : info.expand(entry.params, config.run)) {
      if (!node.always && consumed_by_entries) continue;
      StageConfig expanded;
      expanded.type = std::move(node.type);
      expanded.name = node_name(entry.name, node.node);
      expanded.options.concurrency = node.concurrency;
      expanded.options.queue_capacity = node.queue_capacity;
      for (const std::string& input : node.inputs) {
        expanded.options.inputs.push_back(node_name(entry.name, input));
      }
      if (node.inputs.empty()) expanded.options.inputs = {node.always ? entry.name : output};
      if (node.sends_token_to_entry && out[entry_at].options.token_from.empty()) {
        out[entry_at].options.token_from = expanded.name;
      }
      expanded.params = std::move(node.params);
      expanded.location = entry.location;
      out.push_back(std::move(expanded));
    }
  }
  return out;
}

std::vector<StageDecl> stage_decls(const PipelineConfig& config, const Registry& registry) {
  std::vector<StageDecl> out;
  for (const StageConfig& stage : expanded_stages(config, registry)) {
    const StageInfo& info = registered(stage, registry);
    StageDecl decl{stage.name, info.shape, stage.options};
    if (!info.doc.threads_param.empty()) {
      decl.threads_param = info.doc.threads_param;
      decl.threads_per_invocation = static_cast<std::size_t>(stage.params.get_int(decl.threads_param));
    }
    out.push_back(std::move(decl));
  }
  return out;
}

std::optional<std::size_t> entry_index(const std::vector<StageConfig>& entries,
                                       const std::string& name) {
  for (const std::string& candidate : {name, InputRef::parse(name).stage}) {
    for (std::size_t i = 0; i < entries.size(); ++i) {
      if (entries[i].name == candidate) return i;
    }
  }
  return std::nullopt;
}

PipelineConfig cut_phase(const PipelineConfig& phase,
                         const std::string& output,
                         const Registry& registry) {
  const std::vector<StageConfig>& entries = phase.stages;
  std::optional<std::size_t> last;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].name == output) last = i;
  }
  if (!last) {
    throw Error(phase.origin + ": " + phase_label(phase.name) + "no stage '" + output + "'");
  }
  std::vector<std::vector<std::string>> inputs(*last + 1);
  std::vector<bool> needed(*last + 1, false);
  needed[*last] = true;
  for (std::size_t i = *last + 1; i-- > 0;) {
    inputs[i] =
        effective_inputs(entries[i].options.inputs, registered(entries[i], registry).shape.kind,
                         i > 0 ? entries[i - 1].name : std::string());
    if (!needed[i]) continue;
    for (const std::string& input : inputs[i]) {
      const std::optional<std::size_t> p = entry_index(entries, input);
      if (p && *p < i) needed[*p] = true;
    }
  }
  PipelineConfig cut = phase;
  cut.stages.clear();
  for (std::size_t i = 0; i <= *last; ++i) {
    if (!needed[i]) continue;
    cut.stages.push_back(entries[i]);
    cut.stages.back().options.inputs = std::move(inputs[i]);
  }
  return cut;
}

void resolve_auto_threads(PipelineConfig& phase, const Registry& registry) {
  std::vector<std::pair<StageConfig*, std::string>> autos;  // stage, its threads param
  for (StageConfig& stage : phase.stages) {
    if (stage.auto_threads) autos.emplace_back(&stage, registered(stage, registry).doc.threads_param);
  }
  if (autos.empty()) return;
  for (std::size_t n = threads_and_cores(phase.run).second;; --n) {
    for (auto& [stage, param] : autos) stage->params.set(param, static_cast<std::int64_t>(n));
    if (n == 1 || thread_budget_problem(stage_decls(phase, registry), phase.run).empty()) return;
  }
}

void check_thread_budget(const PipelineConfig& phase, const Registry& registry) {
  // An entry whose nodes work on each item at the same time as it (pipeline partitions) needs
  // a graph thread for each, or they take turns.
  const std::size_t threads = threads_and_cores(phase.run).first;
  for (const StageConfig& entry : phase.stages) {
    const StageInfo& info = registered(entry, registry);
    if (!info.expand) continue;
    std::string together = "'" + entry.name + "'";
    std::size_t count = 1;
    for (const ExpandedNode& node : info.expand(entry.params, phase.run)) {
      if (!node.runs_with_entry) continue;
      together += ", '" + node_name(entry.name, node.node) + "'";
      ++count;
    }
    if (count > threads) {
      throw Error(entry.location + ": " + phase_label(phase.name) + "the nodes " + together +
                  " work on each item at the same time, but the phase has " +
                  std::to_string(threads) + " graph thread" + (threads == 1 ? "" : "s") +
                  ": give it threads: " + std::to_string(count) + " or more");
    }
  }
  const std::string problem = thread_budget_problem(stage_decls(phase, registry), phase.run);
  if (problem.empty()) return;
  const std::string where = phase.stages.empty() ? phase.origin : phase.stages.front().location;
  throw Error(where + ": " + phase_label(phase.name) + problem);
}

}  // namespace flowtrain
