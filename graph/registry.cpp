#include "graph/registry.hpp"

#include "graph/error.hpp"
#include "graph/mix.hpp"
#include "graph/plugin.hpp"

namespace flowtrain {

const char* to_string(StageShape::Kind kind) {
  switch (kind) {
    case StageShape::Kind::kSource:
      return "source";
    case StageShape::Kind::kMap:
      return "map";
    case StageShape::Kind::kFlatMap:
      return "flat map";
    case StageShape::Kind::kSink:
      return "sink";
    case StageShape::Kind::kJoin:
      return "join";
    case StageShape::Kind::kRoute:
      return "router";
    case StageShape::Kind::kMerge:
      return "merge";
    case StageShape::Kind::kMix:
      return "mix";
  }
  return "?";
}

std::size_t StageShape::max_inputs() const {
  switch (kind) {
    case Kind::kSource:
      return 0;
    case Kind::kJoin:
    case Kind::kMerge:
    case Kind::kMix:
      return static_cast<std::size_t>(-1);
    default:
      return 1;
  }
}

std::size_t StageShape::min_inputs() const {
  // None, one, or (for the kinds that take any number) two.
  const std::size_t max = max_inputs();
  return max == static_cast<std::size_t>(-1) ? 2 : max;
}

const ParamSpec* StageInfo::find_param(const std::string& name) const {
  return flowtrain::find_param(doc.params, name);
}

Registry& Registry::global() {
  // Built into the graph: `merge` and `mix`, which run no code of their own.
  static Registry registry = [] {
    Registry r;
    r.add({"merge",
           {"Takes each item back from the branch of a router it went through: the one item with "
            "that sequence number among its inputs, in sequence order. Inputs: two or more "
            "branches of one router; emits their item type.",
            {}},
           MergeStage::static_shape(),
           [](const Params&, const BuildContext&) { return std::unique_ptr<Stage>(new MergeStage); }});
    r.add({"mix", MixStage::describe(), MixStage::static_shape(),
           [](const Params& p, const BuildContext&) {
             return std::unique_ptr<Stage>(new MixStage(options_from<MixStage::Options>(p)));
           }});
    return r;
  }();
  return registry;
}

void Registry::add(StageInfo info) {
  // A plugin loading (load_plugin): its types are checked, then added, once dlopen returns.
  // (global() is built before any plugin loads, so this is never its own initialisation.)
  if (detail::PendingRegistrations* pending = detail::pending_registrations();
      pending && this == &global()) {
    pending->stages.push_back(std::move(info));
    return;
  }
  std::string type = info.type;
  if (!entries_.emplace(type, std::move(info)).second) {
    throw Error("stage type '" + type + "' is registered twice");
  }
}

const StageInfo* Registry::find(const std::string& type) const {
  auto it = entries_.find(type);
  return it == entries_.end() ? nullptr : &it->second;
}

std::vector<const StageInfo*> Registry::all() const {
  std::vector<const StageInfo*> out;
  for (const auto& [type, info] : entries_) out.push_back(&info);
  return out;
}

namespace detail {
void register_stage(const char* type, const std::function<StageInfo()>& make_info) {
  PendingRegistrations* pending = pending_registrations();
  if (!pending) {  // a program's own stages, before main: what throws ends it, as before
    Registry::global().add(make_info());
    return;
  }
  if (!pending->problem.empty()) return;  // the plugin is refused already
  const std::string threw = std::string("registering stage type '") + type + "' threw: ";
  try {
    Registry::global().add(make_info());
  } catch (const std::exception& e) {
    pending->problem = threw + e.what();
  } catch (...) {
    pending->problem = threw + "something that is not a std::exception";
  }
}
}  // namespace detail

}  // namespace flowtrain
