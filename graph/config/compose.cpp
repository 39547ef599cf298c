#include "graph/config/compose.hpp"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "graph/config/suggest.hpp"
#include "graph/names.hpp"

namespace flowtrain::detail {

class PhaseComposer::Impl {
 public:
  Impl(const YAML::Node& phases, Locator& loc, const Registry& registry)
      : phases_(phases),
        loc_(loc),
        registry_(registry),
        done_(phases.size()),
        chain_(phases.size(), 1) {}

  // Phase `i` as validate_pipeline reads it: its own entry, or the phase composed from its base.
  YAML::Node phase(std::size_t i) {
    const YAML::Node entry = phases_[i];
    if (!entry.IsMap() || !entry["extends"]) return entry;
    if (!done_[i]) done_[i] = compose(i);
    return *done_[i];
  }

 private:
  // A stage of the base, as the composition sees it.
  struct BaseStage {
    std::string name;
    YAML::Node entry;
    std::vector<std::string> inputs;  // named, or the stage listed before it (none for a source)
  };

  static std::string name_of(const YAML::Node& phase) {
    const YAML::Node name = phase.IsMap() ? phase["name"] : YAML::Node();
    return name && name.IsScalar() ? name.Scalar() : "";
  }

  // A map of `from`'s entries but those keyed in `skip`: the same key and value nodes.
  static YAML::Node copy_map(const YAML::Node& from, const std::vector<std::string>& skip) {
    YAML::Node out(YAML::NodeType::Map);
    for (auto it = from.begin(); it != from.end(); ++it) {
      const std::string key = it->first.IsScalar() ? it->first.Scalar() : "";
      if (std::find(skip.begin(), skip.end(), key) == skip.end()) {
        out.force_insert(it->first, it->second);
      }
    }
    return out;
  }

  // A whole stage given under `stages`, with its key as its name.
  static YAML::Node named_copy(const YAML::Node& stage, const std::string& name) {
    YAML::Node out = copy_map(stage, {"name"});
    out["name"] = name;
    return out;
  }

  static std::vector<std::string> keys_of(const YAML::Node& map) {
    std::vector<std::string> keys;
    for (auto it = map.begin(); it != map.end(); ++it) {
      if (it->first.IsScalar()) keys.push_back(it->first.Scalar());
    }
    return keys;
  }

  // The names an `inputs` value lists (validate_pipeline refuses any other shape).
  static std::vector<std::string> input_names(const YAML::Node& inputs) {
    std::vector<std::string> names;
    if (inputs.IsScalar()) names.push_back(inputs.Scalar());
    if (inputs.IsSequence()) {
      for (const YAML::Node& n : inputs) {
        if (n.IsScalar()) names.push_back(n.Scalar());
      }
    }
    return names;
  }

  bool is_source(const YAML::Node& entry) const {
    const YAML::Node type = entry["type"];
    const StageInfo* info = type && type.IsScalar() ? registry_.find(type.Scalar()) : nullptr;
    return info && info->shape.kind == StageShape::Kind::kSource;
  }

  // The stages of phase `j` (composed first if it extends another), each with its inputs.
  std::vector<BaseStage> base_stages(std::size_t j) {
    const YAML::Node base = phase(j);
    const std::string ctx = phase_label(name_of(base));
    const YAML::Node stages = base["stages"];
    if (!stages || !stages.IsSequence()) {
      loc_.fail(stages ? stages : base,
                ctx + "'stages' must be a list of at least a source and a sink");
    }
    std::vector<BaseStage> out;
    for (const YAML::Node& entry : stages) {
      const YAML::Node type = entry.IsMap() ? entry["type"] : YAML::Node();
      if (!type || !type.IsScalar()) {
        loc_.fail(entry, ctx + "each stage must be a map with at least a 'type'");
      }
      const YAML::Node name = entry["name"];
      BaseStage stage{name && name.IsScalar() ? name.Scalar() : type.Scalar(), entry, {}};
      if (const YAML::Node inputs = entry["inputs"]) {
        stage.inputs = input_names(inputs);
      } else if (!out.empty() && !is_source(entry)) {
        stage.inputs = {out.back().name};
      }
      out.push_back(std::move(stage));
    }
    return out;
  }

  // The index of the phase that phase `i` extends; refuses an unknown name and a cycle.
  std::size_t base_of(std::size_t i, const std::string& ctx) {
    const YAML::Node extends = phases_[i]["extends"];
    if (!extends.IsScalar() || extends.Scalar().empty()) {
      loc_.fail(extends, ctx + "extends must name another phase, got " + scalar_text(extends));
    }
    std::vector<std::string> names;
    std::optional<std::size_t> base;
    for (std::size_t j = 0; j < phases_.size(); ++j) {
      const std::string name = name_of(phases_[j]);
      if (name == extends.Scalar() && !base) base = j;
      if (j != i && !name.empty()) names.push_back(name);
    }
    if (!base) {
      loc_.fail(extends, ctx + "extends '" + extends.Scalar() +
                             "', which is no phase of this config" +
                             suggestion(extends.Scalar(), names));
    }
    const auto visiting = std::find(composing_.begin(), composing_.end(), *base);
    if (visiting != composing_.end()) {
      std::string chain;
      for (auto it = visiting; it != composing_.end(); ++it) {
        chain += name_of(phases_[*it]) + " -> ";
      }
      loc_.fail(extends, ctx + "extends '" + extends.Scalar() + "', which comes back to it (" +
                             chain + extends.Scalar() +
                             "): a phase cannot extend itself, directly or not");
    }
    return *base;
  }

  [[noreturn]] void refuse_long_chain(std::size_t i) const {
    const YAML::Node extends = phases_[i]["extends"];
    loc_.fail(extends, phase_label(name_of(phases_[i])) + "extends '" + extends.Scalar() +
                           "', which makes a chain of more than " + std::to_string(kMaxChain) +
                           " phases that extend one another");
  }

  YAML::Node compose(std::size_t i) {
    const YAML::Node entry = phases_[i];
    const std::string ctx = phase_label(name_of(entry));
    composing_.push_back(i);
    const std::size_t base_index = base_of(i, ctx);
    // Before recursing deeper: the first phase composing is on a chain longer than the bound.
    if (composing_.size() >= kMaxChain) refuse_long_chain(composing_.front());
    const std::string base_name = name_of(phases_[base_index]);
    const std::vector<BaseStage> base = base_stages(base_index);
    composing_.pop_back();
    chain_[i] = chain_[base_index] + 1;
    if (chain_[i] > kMaxChain) refuse_long_chain(i);
    std::vector<std::string> base_names;
    for (const BaseStage& stage : base) base_names.push_back(stage.name);
    const auto in_base = [&](const std::string& name) {
      return std::find(base_names.begin(), base_names.end(), name) != base_names.end();
    };

    const YAML::Node without = entry["without"];
    const std::vector<std::string> dropped = dropped_stages(without, base_names, base_name, ctx);
    const auto is_dropped = [&](const std::string& name) {
      return std::find(dropped.begin(), dropped.end(), name) != dropped.end();
    };

    const YAML::Node changes = entry["stages"];
    if (changes && !changes.IsNull() && !changes.IsMap()) {
      loc_.fail(changes, ctx +
                             "a phase that extends another gives 'stages' as a map of stage name "
                             "to what changes (student: {params: {lr: 0.01}}), not a list");
    }
    std::vector<std::string> change_keys = kStageKeys;
    change_keys.erase(std::find(change_keys.begin(), change_keys.end(), "name"));
    if (changes && changes.IsMap()) {
      for (auto it = changes.begin(); it != changes.end(); ++it) {
        const std::string name = it->first.as<std::string>();
        const std::string stage_ctx = ctx + "stage '" + name + "': ";
        if (!it->second.IsMap()) {
          loc_.fail_key(it, stage_ctx +
                                "must be a map of the keys that change (params, "
                                "concurrency, ...), or a whole stage with its 'type'");
        }
        if (it->second["name"]) {
          loc_.fail(it->second["name"], stage_ctx + "'name' is not needed: the key is its name");
        }
        check_keys(it->second, change_keys, stage_ctx, loc_);
        if (is_dropped(name)) {
          loc_.fail_key(it, stage_ctx + "'without' drops it, and 'stages' changes it: do one");
        }
        if (!it->second["type"] && !in_base(name)) {
          loc_.fail_key(it, stage_ctx + "phase '" + base_name + "' has no stage '" + name + "'" +
                                suggestion(name, base_names) + "; a stage to add gives its 'type'");
        }
      }
    }
    // The phase's changes to stage `name` (a map, checked above), or a null node.
    const auto change_of = [&](const std::string& name) -> YAML::Node {
      if (!changes || !changes.IsMap()) return YAML::Node();
      const YAML::Node change = changes[name];
      return change ? change : YAML::Node();
    };

    // What fed dropped stage `name`: the outputs of kept stages it took, through dropped ones.
    const auto feeds = [&](const std::string& name) {
      std::vector<std::string> out, seen, todo = {name};
      while (!todo.empty()) {
        const std::string dropped_name = todo.back();
        todo.pop_back();
        if (std::find(seen.begin(), seen.end(), dropped_name) != seen.end()) continue;
        seen.push_back(dropped_name);
        for (const BaseStage& stage : base) {
          if (stage.name != dropped_name) continue;
          for (const std::string& input : stage.inputs) {
            const std::string from = stage_of(input, base_names);
            if (is_dropped(from)) {
              todo.push_back(from);
            } else if (std::find(out.begin(), out.end(), input) == out.end()) {
              out.push_back(input);
            }
          }
        }
      }
      return out;
    };

    // The `inputs` this phase gives a stage are taken as they are: none may be dropped.
    const auto check_given_inputs = [&](const YAML::Node& stage_entry, const std::string& name) {
      const YAML::Node inputs = stage_entry["inputs"];
      if (!inputs) return;
      for (const std::string& input : input_names(inputs)) {
        if (is_dropped(stage_of(input, base_names))) {
          loc_.fail(inputs,
                    ctx + "stage '" + name + "' takes '" + input + "', which 'without' drops");
        }
      }
    };

    YAML::Node stages(YAML::NodeType::Sequence);
    loc_.stand_for(stages, entry);  // a problem of the composed graph is the phase's
    std::string previous;           // the last stage listed so far
    for (const BaseStage& stage : base) {
      if (is_dropped(stage.name)) continue;
      const YAML::Node change = change_of(stage.name);
      const bool changed = change.IsMap();
      const bool whole = changed && change["type"];
      YAML::Node out = whole     ? named_copy(change, stage.name)
                       : changed ? merged_stage(stage.entry, change)
                                 : stage.entry;
      const YAML::Node view = out;  // looked up without adding keys (stage.entry is the base's)
      const YAML::Node token = view["token_from"];
      if (token && token.IsScalar() && is_dropped(token.Scalar())) {
        loc_.fail(without, ctx + "stage '" + stage.name + "' has token_from '" + token.Scalar() +
                               "', which 'without' drops");
      }
      // Its inputs here: its own (a whole stage's, or changed ones), else the base stage's.
      std::vector<std::string> inputs = stage.inputs;
      if (whole || (changed && change["inputs"])) {
        check_given_inputs(view, stage.name);
        inputs = view["inputs"]                          ? input_names(view["inputs"])
                 : !previous.empty() && !is_source(view) ? std::vector{previous}
                                                         : std::vector<std::string>{};
      }
      std::vector<std::string> rewired;
      for (const std::string& input : inputs) {
        const std::string from = stage_of(input, base_names);
        if (!is_dropped(from)) {
          rewired.push_back(input);
          continue;
        }
        const std::vector<std::string> fed = feeds(from);
        if (fed.size() != 1) {
          loc_.fail(without, ctx + "stage '" + stage.name + "' takes '" + input +
                                 "', which 'without' drops, and " +
                                 (fed.empty() ? std::string("nothing fed that")
                                              : "that was fed by " + join(fed)) +
                                 ": give stage '" + stage.name + "' its 'inputs' under 'stages'");
        }
        rewired.push_back(fed.front());
      }
      // A stage that took the one listed before it still does when that is what fed the dropped
      // ones (baseline's student: distill's merge is gone, mixup is listed before it now).
      const bool takes_previous = !view["inputs"] && rewired == std::vector{previous};
      if (rewired != inputs && !takes_previous) {
        out = copy_map(out, {"inputs"});
        YAML::Node names(YAML::NodeType::Sequence);
        for (const std::string& name : rewired) names.push_back(name);
        out["inputs"] = names;
        loc_.stand_for(names, without);
      }
      if (!out.is(stage.entry)) loc_.stand_for(out, changed ? change : without);
      stages.push_back(out);
      previous = stage.name;
    }
    if (changes && changes.IsMap()) {
      for (auto it = changes.begin(); it != changes.end(); ++it) {
        const std::string name = it->first.as<std::string>();
        if (in_base(name)) continue;
        check_given_inputs(it->second, name);
        YAML::Node out = named_copy(it->second, name);
        loc_.stand_for(out, it->second);
        stages.push_back(out);
      }
    }
    YAML::Node composed = copy_map(entry, {"extends", "without", "stages"});
    composed["stages"] = stages;
    loc_.stand_for(composed, entry);
    return composed;
  }

  // The stage an input names: `router.output` is the router's.
  static std::string stage_of(const std::string& input, const std::vector<std::string>& names) {
    if (std::find(names.begin(), names.end(), input) != names.end()) return input;
    return InputRef::parse(input).stage;
  }

  // `without`: a stage name or a list of them, each a stage of the base.
  std::vector<std::string> dropped_stages(const YAML::Node& without,
                                          const std::vector<std::string>& base_names,
                                          const std::string& base_name,
                                          const std::string& ctx) {
    std::vector<std::string> dropped;
    if (!without || without.IsNull()) return dropped;
    if (!without.IsScalar() && !without.IsSequence()) {
      loc_.fail(without, ctx + "without must be a stage name or a list of them, got " +
                             scalar_text(without));
    }
    // `without=[a, b]` on the command line: its items have the override's marks, not the file's.
    const bool overridden = loc_.is_override(without);
    const auto add = [&](const YAML::Node& item) {
      const YAML::Node& where = overridden ? without : item;
      if (!item.IsScalar()) {
        loc_.fail(where, ctx + "without must list stage names, got " + scalar_text(item));
      }
      if (std::find(base_names.begin(), base_names.end(), item.Scalar()) == base_names.end()) {
        loc_.fail(where, ctx + "without: phase '" + base_name + "' has no stage '" + item.Scalar() +
                             "'" + suggestion(item.Scalar(), base_names));
      }
      if (std::find(dropped.begin(), dropped.end(), item.Scalar()) != dropped.end()) {
        loc_.fail(where, ctx + "without names stage '" + item.Scalar() + "' twice");
      }
      dropped.push_back(item.Scalar());
    };
    if (without.IsScalar()) add(without);
    if (without.IsSequence()) {
      for (const YAML::Node& item : without) add(item);
    }
    return dropped;
  }

  // The base's stage entry with `change`'s keys over it; `params` merged key by key.
  YAML::Node merged_stage(const YAML::Node& entry, const YAML::Node& change) {
    YAML::Node out = copy_map(entry, keys_of(change));
    for (auto it = change.begin(); it != change.end(); ++it) {
      const YAML::Node params = entry["params"];
      if (it->first.Scalar() == "params" && params && params.IsMap() && it->second.IsMap()) {
        YAML::Node merged = copy_map(params, keys_of(it->second));
        for (auto p = it->second.begin(); p != it->second.end(); ++p)
          merged.force_insert(p->first, p->second);
        loc_.stand_for(merged, it->second);
        out.force_insert(it->first, merged);
      } else {
        out.force_insert(it->first, it->second);
      }
    }
    return out;
  }

  const YAML::Node phases_;
  Locator& loc_;
  const Registry& registry_;
  std::vector<std::optional<YAML::Node>> done_;
  std::vector<std::size_t> composing_;  // the phases being composed, innermost last
  std::vector<std::size_t> chain_;      // phases in each one's chain of `extends`, itself too
};

PhaseComposer::PhaseComposer(const YAML::Node& phases, Locator& loc, const Registry& registry)
    : impl_(std::make_unique<Impl>(phases, loc, registry)) {}

PhaseComposer::~PhaseComposer() = default;

YAML::Node PhaseComposer::phase(std::size_t i) { return impl_->phase(i); }

}  // namespace flowtrain::detail
