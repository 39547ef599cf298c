// The graph checks (options, edges, tokens, the thread budget) and graph_text: what
// Pipeline::check and the config loader refuse before anything runs.
#include "graph/checks.hpp"

#include <oneapi/tbb/info.h>

#include <algorithm>
#include <string>
#include <vector>

#include "graph/error.hpp"
#include "graph/names.hpp"

namespace flowtrain {

using Kind = StageShape::Kind;
using namespace detail;


namespace detail {

std::string concurrency_text(std::size_t c) {
  return c == kUnlimited ? "unlimited" : std::to_string(c);
}

// The names of the inputs of `stages[i]`: its own list, or the stage before it.
std::vector<std::string> input_names(const std::vector<StageDecl>& stages, std::size_t i) {
  return effective_inputs(stages[i].options.inputs, stages[i].shape.kind,
                          i > 0 ? stages[i - 1].name : std::string());
}

// The index of the stage named `name` among the first `count` of `stages`.
std::optional<std::size_t> index_of(const std::vector<StageDecl>& stages,
                                    const std::string& name,
                                    std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    if (stages[i].name == name) return i;
  }
  return std::nullopt;
}

std::string output_names(const StageDecl& router) {
  std::string out;
  for (const std::string& o : router.shape.outputs) {
    out += (out.empty() ? "'" : ", '") + router.name + "." + o + "'";
  }
  return out;
}

// Resolves an input name, "stage" or "router.output", among the first `count` of `stages`;
// returns a problem (after "stage 'x' takes input 'name'") or an empty string.
std::string resolve(const std::vector<StageDecl>& stages,
                    std::size_t count,
                    const std::string& name,
                    InputLink& link) {
  if (const std::optional<std::size_t> p = index_of(stages, name, count)) {
    if (stages[*p].shape.kind == Kind::kRoute) {
      return ", a router: name one of its outputs (" + output_names(stages[*p]) + ")";
    }
    link = {*p, kAllOutputs};
    return {};
  }
  const InputRef ref = InputRef::parse(name);
  const std::optional<std::size_t> p =
      ref.output.empty() ? std::nullopt : index_of(stages, ref.stage, count);
  if (!p) return ", which is not a stage listed before it; list each stage after its inputs";
  const StageDecl& router = stages[*p];
  const std::vector<std::string>& outputs = router.shape.outputs;
  const auto it = std::find(outputs.begin(), outputs.end(), ref.output);
  if (router.shape.kind != Kind::kRoute) {
    return ", but '" + router.name + "' has no named outputs; take its output as '" + router.name +
           "'";
  }
  if (it == outputs.end()) {
    return ", but router '" + router.name + "' has no output '" + ref.output +
           "' (its outputs: " + output_names(router) + ")";
  }
  link = {*p, static_cast<std::size_t>(it - outputs.begin())};
  return {};
}

// The inputs of stages[i], resolved (the stages before it are valid).
std::vector<InputLink> links_of(const std::vector<StageDecl>& stages, std::size_t i) {
  std::vector<InputLink> links;
  for (const std::string& name : input_names(stages, i)) {
    InputLink link;
    resolve(stages, i, name, link);
    links.push_back(link);
  }
  return links;
}

// The stage that numbers the items of stages[i]: the source (or mix) or the nearest flat map
// upstream.
std::size_t numbered_by(const std::vector<StageDecl>& stages, std::size_t i) {
  while (!pulled(stages[i].shape.kind) && stages[i].shape.kind != Kind::kFlatMap) {
    i = links_of(stages, i).front().stage;
  }
  return i;
}

// The type of the items stages[p] emits (a merge emits its inputs').
ItemType emitted(const std::vector<StageDecl>& stages, std::size_t p) {
  while (stages[p].shape.output.id == typeid(SameAsInputs)) p = links_of(stages, p).front().stage;
  return stages[p].shape.output;
}

}  // namespace detail

std::vector<std::size_t> consumers_of(const std::vector<StageDecl>& stages,
                                      std::size_t p,
                                      std::size_t output) {
  std::vector<std::size_t> out;
  for (std::size_t i = p + 1; i < stages.size(); ++i) {
    for (const InputLink& link : links_of(stages, i)) {
      if (link.stage == p && (output == kAllOutputs || link.output == output)) out.push_back(i);
    }
  }
  return out;
}

namespace detail {

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "'" : ", '") + n + "'";
  return out;
}

}  // namespace detail

std::string options_problem(const StageShape& shape, const StageOptions& options) {
  if (shape.max_concurrency != kUnlimited &&
      (options.concurrency == kUnlimited || options.concurrency > shape.max_concurrency)) {
    return "concurrency " + concurrency_text(options.concurrency) + " is not allowed: a " +
           to_string(shape.kind) + " runs serially";
  }
  if (shape.kind != Kind::kSource && options.queue_capacity < 1) {
    return "queue_capacity must be at least 1";
  }
  return {};
}

std::string add_problem(const std::vector<StageDecl>& earlier,
                        const StageDecl& next,
                        std::vector<InputLink>& inputs) {
  inputs.clear();
  const std::string label = "stage '" + next.name + "'";
  if (std::string problem = options_problem(next.shape, next.options); !problem.empty()) {
    return label + ": " + problem;
  }
  if (index_of(earlier, next.name, earlier.size())) {
    return "two stages are named '" + next.name + "'";
  }
  if (next.shape.kind == Kind::kSource) {
    if (!next.options.inputs.empty()) return "source '" + next.name + "' takes no inputs";
    if (!earlier.empty() && earlier.back().shape.kind != Kind::kSource) {
      return "source '" + next.name + "' must be the first stage (a pipeline has one source, " +
             "or several that one mix takes), but follows '" + earlier.back().name + "'";
    }
    return {};
  }
  const std::size_t sources = static_cast<std::size_t>(
      std::count_if(earlier.begin(), earlier.end(),
                    [](const StageDecl& s) { return s.shape.kind == Kind::kSource; }));
  if (next.shape.kind == Kind::kMix) {
    for (const StageDecl& s : earlier) {
      if (s.shape.kind == Kind::kMix) {
        return "mix '" + next.name + "' follows mix '" + s.name + "': a pipeline has one mix";
      }
    }
  }
  if (earlier.empty()) {
    return "the first stage '" + next.name + "' must be a source, not a " +
           to_string(next.shape.kind);
  }
  const std::vector<std::string> names =
      effective_inputs(next.options.inputs, next.shape.kind, earlier.back().name);
  if (names.size() < next.shape.min_inputs() || names.size() > next.shape.max_inputs()) {
    return label + " is a " + to_string(next.shape.kind) + " and takes " +
           (next.shape.min_inputs() > 1 ? "two or more inputs" : "one input") + ", not " +
           std::to_string(names.size()) + " (inputs: " + join_names(names) + ")";
  }
  for (const std::string& name : names) {
    InputLink link;
    if (std::string problem = resolve(earlier, earlier.size(), name, link); !problem.empty()) {
      return label + " takes input '" + name + "'" + problem;
    }
    for (const InputLink& other : inputs) {
      if (other.stage == link.stage && other.output == link.output) {
        return label + " names input '" + name + "' twice";
      }
    }
    const StageDecl& prev = earlier[link.stage];
    if (next.shape.kind == Kind::kMix && prev.shape.kind != Kind::kSource) {
      return "mix '" + next.name + "' takes sources only, but its input '" + name + "' is a " +
             to_string(prev.shape.kind);
    }
    if (next.shape.kind != Kind::kMix && prev.shape.kind == Kind::kSource && sources > 1) {
      return label + " takes source '" + name + "' directly, but the pipeline has " +
             std::to_string(sources) + " sources: a mix takes them all";
    }
    if (prev.shape.kind == Kind::kSink) {
      return label + " takes its items from the sink '" + prev.name +
             "', which emits none; name its input with `inputs: [...]`";
    }
    if (!next.shape.input.accepts(emitted(earlier, link.stage))) {
      return "item type mismatch: '" + next.name + "' takes " + next.shape.input.name() +
             ", but '" + prev.name + "' emits " + emitted(earlier, link.stage).name();
    }
    if (prev.options.concurrency != kUnlimited &&
        prev.options.concurrency > next.options.queue_capacity) {
      return "queue_capacity " + std::to_string(next.options.queue_capacity) + " of '" +
             next.name + "' is below the concurrency " + std::to_string(prev.options.concurrency) +
             " of '" + prev.name + "': each worker of '" + prev.name +
             "' needs an output slot; raise queue_capacity or lower concurrency";
    }
    // A shared output is copied for each consumer but the last: all of them must allow it.
    const std::vector<std::size_t> sharers = consumers_of(earlier, link.stage, link.output);
    std::vector<const StageDecl*> consumers;
    for (const std::size_t c : sharers) consumers.push_back(&earlier[c]);
    if (!consumers.empty()) consumers.push_back(&next);
    for (const StageDecl* c : consumers) {
      if (!c->shape.copyable_input) {
        return "'" + c->name + "' cannot share the output of '" + prev.name +
               "' with other stages: its input type " + c->shape.input.name() +
               " cannot be copied";
      }
    }
    inputs.push_back(link);
  }
  if (next.shape.kind == Kind::kMerge || next.shape.kind == Kind::kMix) {
    for (std::size_t k = 1; k < inputs.size(); ++k) {
      if (emitted(earlier, inputs[k].stage).id != emitted(earlier, inputs[0].stage).id) {
        return std::string(to_string(next.shape.kind)) + " '" + next.name +
               "' passes on one item type, but '" + names[0] + "' emits " +
               emitted(earlier, inputs[0].stage).name() + " and '" + names[k] + "' emits " +
               emitted(earlier, inputs[k].stage).name();
      }
    }
  }
  if (has_ports(next.shape.kind)) {
    const std::size_t first = numbered_by(earlier, inputs[0].stage);
    for (std::size_t k = 1; k < inputs.size(); ++k) {
      const std::size_t other = numbered_by(earlier, inputs[k].stage);
      if (other != first) {
        return std::string(to_string(next.shape.kind)) + " '" + next.name +
               "' pairs items by sequence number, but its inputs '" +
               names[0] + "' and '" + names[k] + "' are numbered by different stages ('" +
               earlier[first].name + "' and '" + earlier[other].name +
               "'); join branches of one source or flat map";
      }
    }
  }
  return {};
}

namespace detail {

// True if items of stages[from] reach stages[to].
bool reaches(const std::vector<StageDecl>& stages, std::size_t from, std::size_t to) {
  std::vector<std::size_t> frontier = {from};
  std::vector<bool> seen(stages.size());
  while (!frontier.empty()) {
    const std::size_t i = frontier.back();
    frontier.pop_back();
    if (i == to) return true;
    for (const std::size_t c : consumers_of(stages, i)) {
      if (!seen[c]) frontier.push_back(c), seen[c] = true;
    }
  }
  return false;
}

// A problem with the token edge of stages[i] (StageOptions::token_from), else an empty string.
std::string token_problem(const std::vector<StageDecl>& stages, std::size_t i) {
  const StageDecl& stage = stages[i];
  const std::string label = "stage '" + stage.name + "' takes tokens from '" +
                            stage.options.token_from + "'";
  const std::optional<std::size_t> sender =
      index_of(stages, stage.options.token_from, stages.size());
  if (!sender) return label + ", which is not a stage of this pipeline";
  if (pulled(stage.shape.kind) || has_ports(stage.shape.kind)) {
    return label + ", but a " + to_string(stage.shape.kind) + " cannot wait for tokens";
  }
  if (stages[*sender].shape.kind != Kind::kFlatMap) {
    return label + ", a " + to_string(stages[*sender].shape.kind) +
           ": only a flat map sends tokens";
  }
  if (*sender == i || !reaches(stages, i, *sender)) {
    return label + ", which is not downstream of it: a token edge goes back to a stage upstream";
  }
  return {};
}

}  // namespace detail

std::string graph_problem(const std::vector<StageDecl>& stages) {
  if (stages.size() < 2) return "a pipeline needs a source first and a sink last";
  if (stages.back().shape.kind != Kind::kSink) {
    return "the last stage '" + stages.back().name + "' must be a sink, not a " +
           to_string(stages.back().shape.kind);
  }
  for (std::size_t i = 0; i < stages.size(); ++i) {
    if (!stages[i].options.token_from.empty()) {
      if (std::string problem = token_problem(stages, i); !problem.empty()) return problem;
    }
    if (stages[i].shape.kind != Kind::kSink && consumers_of(stages, i).empty()) {
      return "the output of '" + stages[i].name +
             "' goes nowhere: no stage takes it as input; end that branch with a sink " +
             "(type: discard)";
    }
    const std::vector<std::string>& outputs = stages[i].shape.outputs;
    for (std::size_t k = 0; k < outputs.size(); ++k) {
      if (consumers_of(stages, i, k).empty()) {
        return "the output '" + stages[i].name + "." + outputs[k] +
               "' goes nowhere: no stage takes it as input; end that branch with a sink " +
               "(type: discard)";
      }
    }
  }
  return {};
}

namespace detail {

std::size_t hardware_threads() {
  return static_cast<std::size_t>(tbb::info::default_concurrency());
}

// The cores of this machine a job's ranks share: the options', or one per hardware thread.
std::size_t machine_cores(const RunOptions& options) {
  return options.cores > 0 ? options.cores : hardware_threads();
}

// The output slots of stages[i]: the smallest queue_capacity among its consumers (0: none).
std::size_t out_capacity(const std::vector<StageDecl>& stages, std::size_t i) {
  std::size_t cap = 0;
  for (const std::size_t c : consumers_of(stages, i)) {
    const std::size_t q = stages[c].options.queue_capacity;
    cap = cap == 0 ? q : std::min(cap, q);
  }
  return cap;
}

// The concurrency stages[i] can reach: its own, the threads, and its output slots.
std::size_t reachable_workers(std::size_t concurrency, std::size_t threads, std::size_t slots) {
  std::size_t w = concurrency == kUnlimited ? threads : std::min(concurrency, threads);
  if (slots > 0) w = std::min(w, slots);
  return std::max<std::size_t>(w, 1);
}

}  // namespace detail

std::pair<std::size_t, std::size_t> threads_and_cores(const RunOptions& options) {
  const std::size_t ranks = std::max<std::size_t>(options.local_ranks, 1);
  const std::size_t share = std::max<std::size_t>(machine_cores(options) / ranks, 1);
  const std::size_t threads = options.threads > 0 ? options.threads : share;
  return {threads, options.cores > 0 ? share : std::max(share, threads)};
}

std::size_t peak_threads(const std::vector<StageDecl>& stages, std::size_t threads) {
  std::vector<std::size_t> slots;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const std::size_t w =
        reachable_workers(stages[i].options.concurrency, threads, out_capacity(stages, i));
    slots.insert(slots.end(), w, stages[i].threads_per_invocation);
  }
  std::sort(slots.begin(), slots.end(), std::greater<>());
  slots.resize(std::min(slots.size(), threads));
  std::size_t sum = 0;
  for (std::size_t n : slots) sum += n;
  return sum;
}

std::string thread_budget_problem(const std::vector<StageDecl>& stages, const RunOptions& options) {
  const std::size_t machine = machine_cores(options);
  const auto shared = [&]() -> std::string {
    if (options.local_ranks <= 1) return "";
    return " (" + std::to_string(machine) + " shared by " + std::to_string(options.local_ranks) +
           " ranks on this machine)";
  };
  if (machine < options.local_ranks) {
    return "thread budget: no core for each rank" + shared() + "; start fewer ranks" +
           (options.cores > 0 ? " or raise cores" : "");
  }
  const auto [threads, cores] = threads_and_cores(options);
  const std::size_t peak = peak_threads(stages, threads);
  if (peak <= cores) return {};
  std::string heavy;
  std::string param;  // what to lower, as the stages name it
  for (const StageDecl& s : stages) {
    if (s.threads_per_invocation <= 1) continue;
    heavy += ", '" + s.name + "' " + std::to_string(s.threads_per_invocation) + " intra-op threads";
    if (param.empty()) param = s.threads_param;
  }
  return "thread budget: up to " + std::to_string(peak) + " threads could run at once (" +
         std::to_string(threads) + " graph threads" + heavy + "), more than the " +
         std::to_string(cores) + " cores granted" + shared() + "; lower threads" +
         (param.empty() ? std::string() : " or a stage's " + param) + ", or raise cores";
}

std::string graph_text(const std::vector<StageDecl>& stages) {
  std::size_t width = 0;
  for (const StageDecl& s : stages) width = std::max(width, s.name.size());
  std::string out;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const StageDecl& s = stages[i];
    std::string line = s.name + std::string(width + 2 - s.name.size(), ' ');
    std::string kind = to_string(s.shape.kind);
    line += kind + std::string(10 - std::min<std::size_t>(9, kind.size()), ' ');
    std::string from;
    for (const std::string& name : input_names(stages, i))
      from += (from.empty() ? "" : ", ") + name;
    line += from.empty() ? "" : "<- " + from + "  ";
    line += "concurrency " + concurrency_text(s.options.concurrency);
    if (!pulled(s.shape.kind)) line += ", queue " + std::to_string(s.options.queue_capacity);
    if (!s.threads_param.empty()) {
      line += ", " + s.threads_param + " " + std::to_string(s.threads_per_invocation);
    }
    if (s.options.ordered) line += ", ordered";
    if (!s.options.token_from.empty()) line += ", tokens from " + s.options.token_from;
    out += line + "\n";
  }
  return out;
}

}  // namespace flowtrain
