#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "graph/build_context.hpp"
#include "graph/layout.hpp"
#include "graph/options.hpp"
#include "graph/params.hpp"
#include "graph/stage.hpp"

namespace flowtrain {

/// What a stage says about itself: a one-line doc and its parameters.
struct StageDoc {
  std::string summary;
  std::vector<ParamSpec> params;
  /// The int param giving the threads one invocation keeps busy (Stage::threads_per_invocation),
  /// e.g. "intraop_threads"; empty if always 1. Lets a config's thread budget be checked before
  /// anything is built.
  std::string threads_param;
  /// Its results may depend on how many threads compute them (a training step's gradient sums;
  /// a teacher's outputs, which the student learns from): autotune times its counts on
  /// rehearsals only and fixes one before the run's first item.
  bool threads_change_results = false;
};

/// A node a config entry brings with it (see StageInfo::expand).
struct ExpandedNode {
  std::string node;  // named "<entry>/<node>" in the graph
  std::string type;  // a registered stage type
  Params params;     // complete: the type's defaults, then the entry's values
  /// The nodes of the same expansion it takes its items from (by `node`); empty: the entry
  /// itself for a node brought `always`, the entry's output for the others.
  std::vector<std::string> inputs = {};
  std::size_t concurrency = kSerial;
  std::size_t queue_capacity = 8;  // of its input queue (StageOptions::queue_capacity)
  /// Part of the entry's own work, brought whatever takes its output: the entry's output, as
  /// other entries see it, is the last such node's. Other nodes (writers) come only when no
  /// entry takes that output.
  bool always = false;
  /// The entry waits for this node's tokens (StageOptions::token_from).
  bool sends_token_to_entry = false;
  /// Works on each item at the same time as the entry, each waiting for the other's results
  /// (a pipeline partition): the phase needs a graph thread for the entry and each such node.
  bool runs_with_entry = false;
};

/// A registered stage type: everything needed to validate a config entry and to build it.
struct StageInfo {
  std::string type;
  StageDoc doc;
  StageShape shape;
  /// Builds a stage from validated params, with the run's services (BuildContext).
  std::function<std::unique_ptr<Stage>(const Params&, const BuildContext&)> make;
  /// The nodes an entry brings, from its params: the rest of its work (a training step's
  /// grad_sync and optimizer_step) and the nodes that take its output when no other entry does
  /// (the step's log, checkpoint and snapshot writers): one entry in a config, every node in
  /// the report. `run`: the phase's run options (its job's ranks). Empty for most types.
  std::function<std::vector<ExpandedNode>(const Params&, const RunOptions& run)> expand;
  /// Refuses params that their declared ranges cannot (a ViT's heads must divide its dim; a
  /// crop's scale must be [min, max]): throws Error. Run on every entry of every phase when a
  /// config is loaded, so `flowtrain check` and the first phase already refuse what a later
  /// phase would only find when built. Empty for most types.
  std::function<void(const Params&)> check;

  /// The declared param a config's key names (its name or its former name); null if none.
  const ParamSpec* find_param(const std::string& name) const;
};

/// Stage types by name, filled by FLOWTRAIN_REGISTER_STAGE at load time.
class Registry {
 public:
  static Registry& global();

  /// Throws Error if `type` is already registered.
  void add(StageInfo info);
  /// nullptr if unknown.
  const StageInfo* find(const std::string& type) const;
  /// All entries, sorted by type name.
  std::vector<const StageInfo*> all() const;

 private:
  std::map<std::string, StageInfo> entries_;
};

namespace detail {
/// Adds the StageInfo that `make_info` builds to Registry::global() (FLOWTRAIN_REGISTER_STAGE).
/// While a plugin loads (load_plugin), what `make_info` throws is recorded for load_plugin to
/// refuse the plugin with, not thrown out of dlopen's static initialisers.
void register_stage(const char* type, const std::function<StageInfo()>& make_info);

template <class S>
struct Registrar {
  explicit Registrar(const char* type) {
    register_stage(type, [type] { return stage_info(type); });
  }

  static StageInfo stage_info(const char* type) {
    StageInfo info{type, S::describe(), S::static_shape(),
                   [](const Params& p, const BuildContext& context) {
                     auto options = options_from<typename S::Options>(p);
                     if constexpr (std::is_constructible_v<S, decltype(options),
                                                           const BuildContext&>) {
                       return std::unique_ptr<Stage>(new S(options, context));
                     } else {
                       return std::unique_ptr<Stage>(new S(options));
                     }
                   }};
    if constexpr (requires(const Params& p, const RunOptions& r) { S::expand(p, r); }) {
      info.expand = &S::expand;
    }
    if constexpr (requires(const typename S::Options& o) { S::check(o); }) {
      info.check = [](const Params& p) { S::check(options_from<typename S::Options>(p)); };
    }
    return info;
  }
};
}  // namespace detail

}  // namespace flowtrain

#define FLOWTRAIN_CONCAT_INNER(a, b) a##b
#define FLOWTRAIN_CONCAT(a, b) FLOWTRAIN_CONCAT_INNER(a, b)

/// Makes a stage class available to configs under `type`. The class needs an `Options` struct
/// (graph/options.hpp), `static StageDoc describe()` listing `option_specs<Options>()`, and a
/// constructor taking `const Options&` (and `const BuildContext&` if it needs the run's
/// services, such as the process group), and may have
/// `static std::vector<ExpandedNode> expand(const Params&, const RunOptions&)`
/// (StageInfo::expand) and
/// `static void check(const Options&)` (StageInfo::check):
///
///   class SpinStage final : public Map<std::uint64_t, std::uint64_t> { ... };
///   FLOWTRAIN_REGISTER_STAGE("spin", SpinStage);
#define FLOWTRAIN_REGISTER_STAGE(type, Class)                                               \
  static const ::flowtrain::detail::Registrar<Class> FLOWTRAIN_CONCAT(flowtrain_registrar_, \
                                                                      __COUNTER__)(type)
