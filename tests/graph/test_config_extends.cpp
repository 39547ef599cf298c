// Config composition: a phase that `extends` another (graph/config.cpp, PhaseComposer).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include "graph/config.hpp"
#include "graph/error.hpp"
#include "tests/temp_dir.hpp"

using namespace flowtrain;

namespace {

// A source with a path param, in a registry of its own (the global one mirrors docs/config.md).
class FileSource final : public Source<std::uint64_t> {
 public:
  explicit FileSource(const Params&) {}
  static StageDoc describe() {
    return {"numbers named by a file", {path_param("path", "the file")}};
  }

 protected:
  std::optional<std::uint64_t> next() override { return std::nullopt; }
};

// A map with two params, to see them merged one by one.
class Knobs final : public Map<std::uint64_t, std::uint64_t> {
 public:
  explicit Knobs(const Params&) {}
  static StageDoc describe() {
    return {
        "two knobs",
        {int_param("rounds", 1, "work per item", 0), int_param("microseconds", 0, "a pause", 0)}};
  }

 protected:
  std::optional<std::uint64_t> process(std::uint64_t&& v, ItemContext&) override { return v; }
};

const Registry& test_registry() {
  static const Registry registry = [] {
    Registry r = Registry::global();
    r.add({"file_numbers", FileSource::describe(), FileSource::static_shape(),
           [](const Params& p, const BuildContext&) {
             return std::unique_ptr<Stage>(new FileSource(p));
           }});
    r.add({"knobs", Knobs::describe(), Knobs::static_shape(),
           [](const Params& p, const BuildContext&) {
             return std::unique_ptr<Stage>(new Knobs(p));
           }});
    return r;
  }();
  return registry;
}

// Phase `full` routes every 4th number through a spin and merges them back; `lean` is `full`
// without that detour, with its own threads and a change to `after`. Line numbers matter: the
// tests name them.
const char* kComposed = R"(threads: 2
phases:
  - name: full
    stages:
      - {type: sequence, name: numbers, params: {count: 100}}
      - {type: route_every, name: split, params: {every: 4}}
      - {type: spin, inputs: split.picked, concurrency: 2, params: {rounds: 10}}
      - {type: merge, inputs: [split.rest, spin]}
      - {type: knobs, name: after, queue_capacity: 4, params: {rounds: 5, microseconds: 3}}
      - {type: discard}
  - name: lean
    extends: full
    threads: 1
    without: [split, spin, merge]
    stages:
      after: {concurrency: 2, params: {rounds: 7}}
)";

std::string replace(std::string text, const std::string& from, const std::string& to) {
  const auto pos = text.find(from);
  REQUIRE(pos != std::string::npos);
  return text.replace(pos, from.size(), to);
}

RunConfig parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return parse_run_config(text, "kd.yaml", overrides, test_registry());
}

std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse(text, overrides);
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find('\n') == std::string::npos);  // always one line
    return e.what();
  }
  return "";
}

const PipelineConfig& phase(const RunConfig& config, const std::string& name) {
  for (const PipelineConfig& p : config.phases) {
    if (p.name == name) return p;
  }
  FAIL("no phase " << name);
  throw Error("unreachable");
}

const StageConfig& stage(const PipelineConfig& phase, const std::string& name) {
  for (const StageConfig& s : phase.stages) {
    if (s.name == name) return s;
  }
  FAIL("no stage " << name);
  throw Error("unreachable");
}

std::string names(const PipelineConfig& phase) {
  std::string out;
  for (const StageConfig& s : phase.stages) out += (out.empty() ? "" : " ") + s.name;
  return out;
}

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : ",") + item;
  return out;
}

}  // namespace

TEST_CASE("Config.Extends.BaseLessWithoutWithChangesMergedOverIt") {
  const RunConfig c = parse(kComposed);
  const PipelineConfig& full = phase(c, "full");
  const PipelineConfig& lean = phase(c, "lean");
  CHECK(names(full) == "numbers split spin merge after discard");
  CHECK(names(lean) == "numbers after discard");
  // Its own run options; the base's stages, with `after` taking what fed the dropped detour
  // (it named none: the stage listed before it now is that one).
  CHECK(lean.run.threads == 1);
  CHECK(full.run.threads == 2);
  CHECK(stage(lean, "after").options.inputs.empty());
  // Params merged key by key; the other keys replace the base's, the rest stay the base's.
  CHECK(stage(lean, "after").params.get_int("rounds") == 7);
  CHECK(stage(lean, "after").params.get_int("microseconds") == 3);
  CHECK(stage(lean, "after").options.concurrency == 2);
  CHECK(stage(lean, "after").options.queue_capacity == 4);
  CHECK(stage(lean, "numbers").params.get_int("count") == 100);
  // The base is its own self.
  CHECK(stage(full, "after").params.get_int("rounds") == 5);
  CHECK(stage(full, "after").options.concurrency == 1);
  // A message about a changed stage names the line of the change, an inherited one the base's.
  CHECK(stage(lean, "after").location == "kd.yaml:16");
  CHECK(stage(lean, "numbers").location == "kd.yaml:5");
}

TEST_CASE("Config.Extends.SeesTheBaseAfterOverrides") {
  // An override of the base reaches the derived phase, but not a key the derived one sets.
  const RunConfig c = parse(kComposed, {"phases.full.stages.numbers.params.count=9",
                                        "phases.full.stages.after.params.rounds=8",
                                        "phases.full.stages.after.params.microseconds=4"});
  CHECK(stage(phase(c, "lean"), "numbers").params.get_int("count") == 9);
  CHECK(stage(phase(c, "lean"), "after").params.get_int("microseconds") == 4);
  CHECK(stage(phase(c, "lean"), "after").params.get_int("rounds") == 7);
  CHECK(stage(phase(c, "full"), "after").params.get_int("rounds") == 8);

  // The derived phase's stages by name, changed there or not: the change map grows.
  const RunConfig d =
      parse(kComposed, {"phases.lean.stages.numbers.params.count=5",
                        "phases.lean.stages.after.params.rounds=3", "phases.lean.threads=2"});
  CHECK(stage(phase(d, "lean"), "numbers").params.get_int("count") == 5);
  CHECK(stage(phase(d, "lean"), "after").params.get_int("rounds") == 3);
  CHECK(phase(d, "lean").run.threads == 2);
  CHECK(stage(phase(d, "full"), "numbers").params.get_int("count") == 100);
}

TEST_CASE("Config.Extends.StageWithTypeReplacesOrAdds") {
  // A stage given whole (with its `type`) replaces the base's of that name, params not merged,
  // in its place; one the base lacks is added at the end, taking the stage listed before it.
  const RunConfig c =
      parse(replace(kComposed, "      after: {concurrency: 2, params: {rounds: 7}}\n",
                    "      after: {type: knobs, params: {rounds: 7}}\n"
                    "      discard: {type: drop_every, params: {every: 2}}\n"
                    "      sink: {type: discard}\n"));
  const PipelineConfig& lean = phase(c, "lean");
  CHECK(names(lean) == "numbers after discard sink");
  CHECK(stage(lean, "after").params.get_int("microseconds") == 0);  // the default, not 3
  CHECK(stage(lean, "after").options.queue_capacity == 8);
  CHECK(stage(lean, "discard").type == "drop_every");
  CHECK(stage(lean, "sink").type == "discard");
  CHECK(stage(lean, "sink").location == "kd.yaml:18");
}

TEST_CASE("Config.Extends.InputsOfDroppedStagesRewired") {
  SUBCASE("a stage that took a dropped one takes what fed it") {
    const PipelineConfig lean = phase(parse(kComposed, {"phases.lean.without=[split]"}), "lean");
    CHECK(names(lean) == "numbers spin merge after discard");
    CHECK(joined(stage(lean, "spin").options.inputs) == "numbers");
    CHECK(joined(stage(lean, "merge").options.inputs) == "numbers,spin");
    CHECK(stage(lean, "after").options.inputs.empty());
  }
  SUBCASE("a stage fed by two through the dropped ones is refused, by name") {
    CHECK(error_of(kComposed, {"phases.lean.without=[merge]"}) ==
          "override 'phases.lean.without=[merge]': phase 'lean': stage 'after' takes 'merge', "
          "which 'without' drops, and that was fed by split.rest, spin: give stage 'after' its "
          "'inputs' under 'stages'");
  }
  SUBCASE("unless the phase gives it its inputs") {
    const PipelineConfig lean = phase(
        parse(kComposed, {"phases.lean.without=[merge]", "phases.lean.stages.after.inputs=spin",
                          "phases.lean.stages.tail.type=discard",
                          "phases.lean.stages.tail.inputs=split.rest"}),
        "lean");
    CHECK(names(lean) == "numbers split spin after discard tail");
    CHECK(joined(stage(lean, "after").options.inputs) == "spin");
  }
}

TEST_CASE("Config.Extends.ChainsAndForwardReferences") {
  // `first` extends `lean`, listed after it, which extends `full`.
  const std::string text = replace(
      kComposed, "phases:\n",
      "phases:\n  - name: first\n    extends: lean\n    stages: {numbers: {params: {count: 3}}}\n");
  const RunConfig c = parse(text);
  CHECK(c.phases.front().name == "first");
  CHECK(names(c.phases.front()) == "numbers after discard");
  CHECK(stage(c.phases.front(), "numbers").params.get_int("count") == 3);
  CHECK(stage(c.phases.front(), "after").params.get_int("rounds") == 7);
  CHECK(c.phases.front().run.threads == 2);  // its own (the top level's), not lean's 1
}

TEST_CASE("Config.Extends.Errors") {
  // Each: kComposed with `from` replaced by `to` (none when `from` is empty), the overrides,
  // and the one line it fails with.
  struct Case {
    const char* what;
    const char* from;
    const char* to;
    std::vector<std::string> overrides;
    std::string error;
  };
  // One case a few lines, as a table.
  // clang-format off
  const std::vector<Case> cases = {
      {"an unknown base", "extends: full", "extends: ful", {},
       "kd.yaml:12: phase 'lean': extends 'ful', which is no phase of this config (did you mean "
       "'full'?)"},
      {"a phase that extends itself", "extends: full", "extends: lean", {},
       "kd.yaml:12: phase 'lean': extends 'lean', which comes back to it (lean -> lean): a phase "
       "cannot extend itself, directly or not"},
      {"a cycle through two phases", "", "", {"phases.full.extends=lean"},
       "kd.yaml:12: phase 'lean': extends 'full', which comes back to it (full -> lean -> full): "
       "a phase cannot extend itself, directly or not"},
      {"extends is no name", "", "", {"phases.lean.extends=[full]"},
       "override 'phases.lean.extends=[full]': phase 'lean': extends must name another phase, "
       "got a list"},
      {"without names a stage the base lacks", "[split, spin, merge]", "[split, spin, merg]", {},
       "kd.yaml:14: phase 'lean': without: phase 'full' has no stage 'merg' (did you mean "
       "'merge'?)"},
      {"without in a phase that extends none", "", "", {"phases.full.without=[split]"},
       "override 'phases.full.without=[split]': phase 'full': 'without' drops stages of the "
       "phase named by 'extends', which this phase does not have"},
      {"a change names a stage the base lacks", "      after: {", "      afte: {", {},
       "kd.yaml:16: phase 'lean': stage 'afte': phase 'full' has no stage 'afte' (did you mean "
       "'after'?); a stage to add gives its 'type'"},
      {"an override names a stage the base lacks", "", "",
       {"phases.lean.stages.numbrs.params.count=5"},
       "override 'phases.lean.stages.numbrs.params.count=5': phase 'lean': stage 'numbrs': phase "
       "'full' has no stage 'numbrs' (did you mean 'numbers'?); a stage to add gives its 'type'"},
      {"a bad value in a change", "rounds: 7", "rounds: -7", {},
       "kd.yaml:16: phase 'lean': stage 'after' (knobs): param 'rounds' must be >= 0, got -7"},
      {"an unknown param in a change", "rounds: 7", "rouns: 7", {},
       "kd.yaml:16: phase 'lean': stage 'after' (knobs): unknown param 'rouns' (did you mean "
       "'rounds'?)"},
      {"stages as a list", "    stages:\n      after:", "    stages:\n      - after:", {},
       "kd.yaml:16: phase 'lean': a phase that extends another gives 'stages' as a map of stage "
       "name to what changes (student: {params: {lr: 0.01}}), not a list"},
      {"a name beside its key", "after: {concurrency: 2,", "after: {name: x, concurrency: 2,", {},
       "kd.yaml:16: phase 'lean': stage 'after': 'name' is not needed: the key is its name"},
      {"an unknown key in a change", "after: {concurrency: 2,", "after: {concurency: 2,", {},
       "kd.yaml:16: phase 'lean': stage 'after': unknown key 'concurency' (did you mean "
       "'concurrency'?)"},
      {"a stage dropped and changed", "after: {concurrency", "spin: {concurrency", {},
       "kd.yaml:16: phase 'lean': stage 'spin': 'without' drops it, and 'stages' changes it: do "
       "one"},
      {"no stages left", "", "",
       {"phases.lean.stages={}", "phases.lean.without=[split, spin, merge, after, discard]"},
       "kd.yaml:11: phase 'lean': 'stages' must be a list of at least a source and a sink"},
      {"the composed graph checked as any", "", "", {"phases.lean.without=[discard]"},
       "kd.yaml:11: phase 'lean': the last stage 'after' must be a sink, not a map"},
  };
  // clang-format on
  for (const Case& c : cases) {
    CAPTURE(c.what);
    const std::string text = *c.from ? replace(kComposed, c.from, c.to) : std::string(kComposed);
    CHECK(error_of(text, c.overrides) == c.error);
  }
}

TEST_CASE("Config.Extends.EffectiveTextReadsBackTheSame") {
  // The saved text keeps `extends` (an override of the base given to it later still reaches
  // the derived phase), and reads back as the same phases.
  const RunConfig c = parse(kComposed, {"phases.full.stages.numbers.params.count=9",
                                        "phases.lean.stages.after.params.rounds=3"});
  CHECK(c.effective_text.find("extends: full") != std::string::npos);
  const RunConfig again = parse(c.effective_text);
  for (const char* name : {"full", "lean"}) {
    REQUIRE(names(phase(again, name)) == names(phase(c, name)));
    for (const StageConfig& s : phase(c, name).stages) {
      CHECK(stage(phase(again, name), s.name).params.values() == s.params.values());
      CHECK(joined(stage(phase(again, name), s.name).options.inputs) == joined(s.options.inputs));
    }
  }
}

TEST_CASE("Config.Extends.PathsOfAChangeRelativeToTheConfigFile") {
  testing::TempDir dir("extends");
  std::filesystem::create_directories(dir / "conf");
  std::ofstream(dir / "conf" / "a.txt") << "1\n";
  std::ofstream(dir / "conf" / "b.txt") << "2\n";
  std::ofstream(dir / "conf" / "run.yaml")
      << "phases:\n"
         "  - name: one\n"
         "    stages:\n"
         "      - {type: file_numbers, name: source, params: {path: a.txt}}\n"
         "      - {type: discard}\n"
         "  - name: two\n"
         "    extends: one\n"
         "    stages: {source: {params: {path: b.txt}}}\n";
  const RunConfig c = load_run_config(dir.str("conf/run.yaml"), {}, test_registry());
  CHECK(stage(phase(c, "one"), "source").params.get_string("path") == dir.str("conf/a.txt"));
  CHECK(stage(phase(c, "two"), "source").params.get_string("path") == dir.str("conf/b.txt"));
  // Written absolute in the effective text, so it reads the same from any folder.
  CHECK(c.effective_text.find("path: " + dir.str("conf/b.txt")) != std::string::npos);
}

TEST_CASE("Config.Extends.WithoutOfAnyStage") {
  // Phases that give no `stages` of their own (each failed on yaml-cpp's "invalid node").
  const auto derived = [](const std::string& lines) {
    return phase(parse(std::string(kComposed) + "  - name: derived\n    extends: full\n" + lines),
                 "derived");
  };
  SUBCASE("a phase that extends and changes nothing is its base's stages") {
    const PipelineConfig same = derived("");
    CHECK(names(same) == "numbers split spin merge after discard");
    CHECK(joined(stage(same, "merge").options.inputs) == "split.rest,spin");
    CHECK(stage(same, "after").location == "kd.yaml:9");
  }
  SUBCASE("a chain's middle stage: the next stage takes what it took") {
    const PipelineConfig mid = derived("    without: after\n");
    CHECK(names(mid) == "numbers split spin merge discard");
    CHECK(stage(mid, "discard").options.inputs.empty());  // merge is listed before it now
    const PipelineConfig no_spin = derived("    without: spin\n");
    CHECK(names(no_spin) == "numbers split merge after discard");
    CHECK(joined(stage(no_spin, "merge").options.inputs) == "split.rest,split.picked");
  }
  SUBCASE("a router: its branches take what fed it") {
    const PipelineConfig direct = derived("    without: [split]\n");
    CHECK(names(direct) == "numbers spin merge after discard");
    CHECK(joined(stage(direct, "spin").options.inputs) == "numbers");
    CHECK(joined(stage(direct, "merge").options.inputs) == "numbers,spin");
  }
  SUBCASE("a stage named twice") {
    CHECK(error_of(std::string(kComposed) +
                   "  - name: derived\n    extends: full\n    without: [spin, spin]\n") ==
          "kd.yaml:19: phase 'derived': without names stage 'spin' twice");
  }
}

TEST_CASE("Config.Extends.ErrorsNameTheLine") {
  struct Case {
    const char* what;
    const char* from;
    const char* to;
    std::vector<std::string> overrides;
    std::string error;
  };
  // clang-format off
  const std::vector<Case> cases = {
      {"a stage named twice", "[split, spin, merge]", "[split, spin, merge, spin]", {},
       "kd.yaml:14: phase 'lean': without names stage 'spin' twice"},
      {"a stage named twice by an override", "", "", {"phases.lean.without=[split, split]"},
       "override 'phases.lean.without=[split, split]': phase 'lean': without names stage 'split' "
       "twice"},
      {"a change's inputs name a dropped stage", "after: {concurrency: 2,",
       "after: {inputs: spin, concurrency: 2,", {},
       "kd.yaml:16: phase 'lean': stage 'after' takes 'spin', which 'without' drops"},
      {"a whole stage's inputs name a dropped stage", "after: {concurrency: 2,",
       "after: {type: knobs, inputs: [split.rest], concurrency: 2,", {},
       "kd.yaml:16: phase 'lean': stage 'after' takes 'split.rest', which 'without' drops"},
      {"an added stage's inputs name a dropped stage", "", "",
       {"phases.lean.stages.tail.type=discard", "phases.lean.stages.tail.inputs=merge"},
       "override 'phases.lean.stages.tail.inputs=merge': phase 'lean': stage 'tail' takes "
       "'merge', which 'without' drops"},
  };
  // clang-format on
  for (const Case& c : cases) {
    CAPTURE(c.what);
    const std::string text = *c.from ? replace(kComposed, c.from, c.to) : std::string(kComposed);
    CHECK(error_of(text, c.overrides) == c.error);
  }
}

TEST_CASE("Config.Extends.LongChainRefusedQuickly" * doctest::timeout(20)) {
  // p1 extends p0, p2 extends p1, ...: listed in order, or in reverse (composed on the way down
  // from the first listed). 1000 deep took 3.2 GB.
  const auto chain = [](int count, bool reversed) {
    std::string text = "phases:\n";
    for (int k = 0; k < count; ++k) {
      const int i = reversed ? count - 1 - k : k;
      text += "  - name: p" + std::to_string(i) + "\n";
      text += i == 0 ? "    stages: [{type: sequence, params: {count: 1}}, {type: discard}]\n"
                     : "    extends: p" + std::to_string(i - 1) + "\n";
    }
    return text;
  };
  CHECK(error_of(chain(1000, false)) ==
        "kd.yaml:67: phase 'p32': extends 'p31', which makes a chain of more than 32 phases that "
        "extend one another");
  CHECK(error_of(chain(1000, true)) ==
        "kd.yaml:3: phase 'p999': extends 'p998', which makes a chain of more than 32 phases that "
        "extend one another");
  for (const bool reversed : {false, true}) {
    CAPTURE(reversed);
    CHECK(parse(chain(32, reversed)).phases.size() == 32);
    CHECK(error_of(chain(33, reversed)).find("a chain of more than 32 phases") !=
          std::string::npos);
  }
}

// A phase cut to one entry (what the Python Loader runs): the entries it depends on, in order,
// each naming its inputs, the default one (the entry before) spelled out since the cut may drop
// that entry; the entries it does not need, before or after it, are gone.
TEST_CASE("Config.Cut.KeepsWhatTheOutputDependsOnWithItsInputsNamed") {
  const RunConfig config = parse(R"(stages:
  - {type: sequence, name: numbers, params: {count: 100}}
  - {type: route_every, name: split, params: {every: 4}}
  - {type: spin, name: a, inputs: split.picked}
  - {type: spin, name: b, inputs: split.rest}
  - {type: spin, name: c}
  - {type: merge, inputs: [a, c]}
  - {type: discard}
)");
  const PipelineConfig& full = config.phases.front();
  const auto names_and_inputs = [](const PipelineConfig& cut) {
    std::vector<std::string> out;
    for (const StageConfig& s : cut.stages) {
      std::string line = s.name + " <-";
      for (const std::string& input : s.options.inputs) line += " " + input;
      out.push_back(line);
    }
    return out;
  };
  // c follows b with no inputs named: it takes b, so the cut keeps b and says so; a is not needed.
  CHECK(names_and_inputs(cut_phase(full, "c", test_registry())) ==
        std::vector<std::string>{"numbers <-", "split <- numbers", "b <- split.rest", "c <- b"});
  CHECK(names_and_inputs(cut_phase(full, "merge", test_registry())) ==
        std::vector<std::string>{"numbers <-", "split <- numbers", "a <- split.picked",
                                 "b <- split.rest", "c <- b", "merge <- a c"});
  CHECK(names_and_inputs(cut_phase(full, "split", test_registry())) ==
        std::vector<std::string>{"numbers <-", "split <- numbers"});
  // The input that names a router's output leads to the router.
  CHECK(entry_index(full.stages, "split.rest") == 1);
  CHECK_FALSE(entry_index(full.stages, "nothing"));
  CHECK_THROWS_WITH_AS(cut_phase(full, "split.rest", test_registry()),
                       doctest::Contains("no stage 'split.rest'"), Error);
}
