#include "graph/pipeline.hpp"

#include <optional>
#include <string>
#include <vector>

#include "graph/checks.hpp"
#include "graph/error.hpp"
#include "graph/mix.hpp"
#include "graph/run_state.hpp"

namespace flowtrain {

using Kind = StageShape::Kind;

Pipeline::Pipeline() = default;

std::vector<StageDecl> Pipeline::decls() const {
  std::vector<StageDecl> out;
  for (const Node& node : nodes_) {
    out.push_back({node.name, node.shape, node.options, node.stage->threads_per_invocation()});
  }
  return out;
}

void Pipeline::add_node(const std::string& name,
                        std::unique_ptr<Stage> stage,
                        StageOptions options) {
  if (!stage) throw Error("stage '" + name + "' is null");
  if (ran_) throw Error("stage '" + name + "' is added to a pipeline that ran already");
  if (stage->requires_order()) options.ordered = true;
  const StageShape shape = stage->shape();
  if (std::string problem = options_problem(shape, options); !problem.empty()) {
    throw Error("stage '" + name + "': " + problem);
  }
  nodes_.push_back({name, std::move(stage), shape, std::move(options), {}});
}

void Pipeline::add_input(const std::string& stage, const std::string& input) {
  for (Node& node : nodes_) {
    if (node.name == stage) {
      node.options.inputs.push_back(input);
      return;
    }
  }
  throw Error("connect: no stage '" + stage + "' in this pipeline");
}

void Pipeline::check_options(const std::string& name,
                             const std::vector<ParamSpec>& specs,
                             const Params& params) {
  for (const ParamSpec& spec : specs) {
    if (std::string problem = value_problem(spec, params.values().at(spec.name));
        !problem.empty()) {
      throw Error("stage '" + name + "': param '" + spec.name + "' " + problem);
    }
  }
}

std::vector<std::vector<InputLink>> Pipeline::resolve_inputs() const {
  std::vector<StageDecl> earlier;
  std::vector<std::vector<InputLink>> links(nodes_.size());
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    StageDecl decl{nodes_[i].name, nodes_[i].shape, nodes_[i].options};
    if (std::string problem = add_problem(earlier, decl, links[i]); !problem.empty()) {
      throw Error(problem);
    }
    for (const InputLink& link : links[i]) {
      if (std::string problem = nodes_[i].stage->input_problem(*nodes_[link.stage].stage);
          !problem.empty()) {
        throw Error("stage '" + nodes_[i].name + "': " + problem);
      }
    }
    earlier.push_back(std::move(decl));
  }
  if (std::string problem = graph_problem(earlier); !problem.empty()) throw Error(problem);
  return links;
}

void Pipeline::check() const { resolve_inputs(); }

Pipeline::~Pipeline() = default;

void Pipeline::set_concurrency(const std::string& stage, std::size_t concurrency) {
  change_options(stage, [&](StageOptions& options) { options.concurrency = concurrency; });
}

void Pipeline::set_queue_capacity(const std::string& stage, std::size_t capacity) {
  change_options(stage, [&](StageOptions& options) { options.queue_capacity = capacity; });
}

void Pipeline::change_options(const std::string& stage,
                              const std::function<void(StageOptions&)>& change) {
  Node& node = node_to_change(stage);
  StageOptions options = node.options;
  change(options);
  if (std::string problem = options_problem(node.shape, options); !problem.empty()) {
    throw Error("stage '" + stage + "': " + problem);
  }
  node.options = std::move(options);
}

bool Pipeline::set_threads_per_invocation(const std::string& stage, std::size_t threads) {
  if (threads < 1) throw Error("stage '" + stage + "': threads per invocation must be >= 1");
  return node_to_change(stage).stage->set_threads_per_invocation(threads);
}

std::uint64_t Pipeline::produced() const {
  const RunState* state = published_.load(std::memory_order_acquire);
  return state ? state->counters[state->source]->items_out.load(std::memory_order_relaxed) : 0;
}

std::uint64_t Pipeline::completed() const {
  const RunState* state = published_.load(std::memory_order_acquire);
  return state ? state->counters.back()->items_in.load(std::memory_order_relaxed) : 0;
}

Pipeline::Node& Pipeline::node_to_change(const std::string& stage) {
  if (ran_ && !paused_) {
    throw Error("stage '" + stage + "': a pipeline that ran to its end cannot change its layout");
  }
  for (Node& node : nodes_) {
    if (node.name == stage) return node;
  }
  throw Error("no stage '" + stage + "' in this pipeline");
}

void Pipeline::prepare() {
  // Resume: every stage that restored a checkpoint must agree on where the source restarts.
  std::optional<ResumePosition> resume;
  std::string asked_by;
  for (const Node& node : nodes_) {
    const std::optional<ResumePosition> p = node.stage->resume_position();
    if (!p) continue;
    if (resume && *p != *resume) {
      throw Error("stages '" + asked_by + "' and '" + node.name +
                  "' resume from different source positions (" + std::to_string(resume->items) +
                  " and " + std::to_string(p->items) +
                  "); their checkpoints are from different runs");
    }
    resume = p;
    asked_by = node.name;
  }
  const auto mix = std::find_if(nodes_.begin(), nodes_.end(),
                                [](const Node& n) { return n.shape.kind == Kind::kMix; });
  const std::string resumes_from =
      resume
          ? "stage '" + asked_by + "' resumes from source position " + std::to_string(resume->items)
          : "";
  if (mix != nodes_.end()) {
    const auto& stage = static_cast<const MixStage&>(*mix->stage);
    stage.check_inputs(mix->name, mix->inputs.size());
    if (resume && resume->resized) {
      const std::string why = "' cannot: its order is counted per rank; resume on the "
                              "checkpoint's number of ranks or start without it";
      throw Error("stage '" + asked_by + "' resumes a checkpoint written by another number of " +
                  "ranks, but mix '" + mix->name + why);
    }
    if (resume && resume->items > 0) {
      // Replay the mix's choices to find how far each input had gone.
      std::vector<std::optional<std::uint64_t>> sizes;
      for (const InputLink& link : mix->inputs) {
        sizes.push_back(nodes_[link.stage].stage->plan(std::nullopt));
      }
      const std::vector<std::uint64_t> taken =
          stage.split(resume->items, sizes).value_or(std::vector<std::uint64_t>(sizes.size()));
      for (std::size_t k = 0; k < mix->inputs.size(); ++k) {
        const Node& input = nodes_[mix->inputs[k].stage];
        if (!sizes[k] || (taken[k] > 0 && !input.stage->seek(taken[k]))) {
          throw Error(resumes_from + ", but source '" + input.name + "' of mix '" + mix->name +
                      "' cannot seek" + (sizes[k] ? "" : " (its size is unknown)") +
                      "; use dataset sources or start without the checkpoint");
        }
      }
      mix->stage->seek(resume->items);
    }
  } else if (resume) {
    Stage& source = *nodes_[0].stage;
    const std::string at = resumes_from + ", but source '" + nodes_[0].name + "' ";
    // The shared position where the source has one: it means the same on any number of ranks.
    const bool shared = resume->shared && source.seek_shared(*resume->shared);
    if (!shared && resume->resized) {
      throw Error(resumes_from + " (written by another number of ranks), but source '" +
                  nodes_[0].name + "' cannot " +
                  (resume->shared ? "reach its shared position " + std::to_string(*resume->shared)
                                  : std::string("say where that is in the order the ranks share")) +
                  "; resume on the checkpoint's number of ranks or start without it");
    }
    if (!shared && resume->items > 0 && !source.seek(resume->items)) {
      if (const std::optional<std::uint64_t> total = source.plan(std::nullopt);
          total && resume->items > *total) {
        throw Error(at + "has only " + std::to_string(*total) +
                    " items: the checkpoint is from a run over more data; give the run that data "
                    "or start without the checkpoint");
      }
      throw Error(at + "cannot seek; use a dataset source or start without the checkpoint");
    }
  }
  expected_ = planned_items().value_or(0);
}

std::optional<std::uint64_t> Pipeline::planned_items() {
  // The count each stage passes on (from its first input; a mix: the sum of its inputs');
  // what reaches the last sink is what the progress line expects.
  const std::vector<std::vector<InputLink>> links = resolve_inputs();
  std::vector<std::optional<std::uint64_t>> planned(nodes_.size());
  std::optional<std::uint64_t> last;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    std::optional<std::uint64_t> in =
        links[i].empty() ? std::nullopt : planned[links[i].front().stage];
    if (nodes_[i].shape.kind == Kind::kMix) {
      std::uint64_t sum = 0;
      for (const InputLink& link : links[i]) {
        if (!planned[link.stage]) in = std::nullopt;
        sum += planned[link.stage].value_or(0);
      }
      if (in) in = sum;
    }
    if (i + 1 == nodes_.size()) last = in;
    planned[i] = nodes_[i].stage->plan(in);
  }
  return last;
}

}  // namespace flowtrain
