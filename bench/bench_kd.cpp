// bench_kd: knowledge-distillation training throughput, and where each step's time goes, for
// layouts of the run's cores between the teacher and the student.
//
//   image_folder -> [q] -> jpeg_decode (2) -> [q] -> augment (2, 112 px) -> [q] -> collate (64)
//     -> [q 2] -> teacher_infer (vit_cpu_teacher) -> [q 2] -> train_step (vit_cpu_student)
//
// Teacher dim 384 depth 6 heads 6, student dim 192 depth 4 heads 3, both patch 16 at 112 px,
// batch 64, alpha 0.5, no checkpoints. The teacher is randomly initialised (its weights do not
// change the speed) and saved once with save_checkpoint. Layouts (`--layouts`, default A,B,C):
//   A "turns"  1 graph thread; teacher and student 2 intra-op threads each: each model uses both
//              cores in turn, the data stages run in between on the same thread.
//   B "split"  2 graph threads; teacher and student 1 intra-op thread each: they run at once on
//              different batches, one core each.
//   C "split, teacher x2"  as B, with teacher_infer at concurrency 2: either thread may run a
//              teacher batch while the student has nothing to do.
//   D "cached" a teacher_cache before the teacher (misses through it, hits around it, merged
//              before the student), 1 graph thread, the student on 2 intra-op threads. Its
//              warm-up is a full run that fills the cache with the views the timed runs show
//              (the same source, seed and epochs), so every timed run is all hits: the student
//              against a warm cache. Not in the default list.
//   N "naive"  1 graph thread, every stage at concurrency 1 and 1 intra-op thread.
//   T "naive, autotuned"  N with `autotune: {warmup_s: 0.5, trial_s: 1.5, max_trials: 8}`: its
//              images/s include the trials (the rehearsals that fix the student's intra-op
//              threads first, then any on real steps); the rate after them is listed too.
//              Give it --steps 60 or more, so tuning is a part of the run, not all of it.
// Each layout has one warm-up run (first touch of memory is slow on these VMs); then the layouts
// run in turn, A, B, C, A, B, C, ... for --reps rounds, each run a freshly built pipeline of
// --steps batches. Figures are medians over the rounds; the ratios to the first layout listed
// are taken within each round (runs minutes apart on a shared machine drift), then their median.
//
// Per step: "student waits" is train_step's starved share x wall / steps (its input queue
// empty: in A this includes the teacher's time, which runs on the same thread), "teacher waits"
// the same for teacher_infer, per worker (the data stages not keeping up; in A it includes the
// student's time, in C a second teacher worker with no batch to take), "teacher" its busy time
// per batch, forward / backward / optimizer the student's own split. "CPU/wall" is this process's
// CPU time over the run's wall time (cores kept busy, OpenMP spin-waiting included); "others'
// CPU/wall" is the rest of the machine's (/proc/stat), to tell a noisy round from a slow layout.
//
// Run: build/bench/bench_kd [--steps 20] [--reps 3] [--layouts A,B,C] [--data FOLDER]
//        [--warmup 3] [--autocast none|bf16]
// Without --data it generates 128x128 synthetic JPEGs (10 classes) in a temp folder.
#include <stdlib.h>
#include <sys/resource.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.hpp"
#include "graph/autotune.hpp"
#include "graph/config.hpp"
#include "graph/error.hpp"
#include "graph/freed_memory.hpp"
#include "stages/data/sources/synthetic.hpp"
#include "stages/train/files/checkpoint.hpp"
#include "stages/train/models/vit.hpp"
#include "stages/train/step/step_times.hpp"

namespace {

namespace fs = std::filesystem;
using flowtrain::bench::median;
using flowtrain::bench::now_utc;

constexpr int kImageSize = 112;
constexpr int kBatch = 64;
constexpr int kClasses = 10;
constexpr int kSyntheticSide = 128;

struct Layout {
  std::string key;  // "A"
  std::string name;
  std::size_t threads;
  int teacher_intraop;
  int teacher_concurrency;
  int student_intraop;
  bool cached = false;
  int data_concurrency = 2;  // jpeg_decode and augment
  bool autotune = false;
};

const std::vector<Layout>& all_layouts() {
  static const std::vector<Layout> layouts = {
      {"A", "turns", 1, 2, 1, 2},
      {"B", "split", 2, 1, 1, 1},
      {"C", "split, teacher x2", 2, 1, 2, 1},
      {"D", "cached", 1, 2, 1, 2, true},
      {"N", "naive", 1, 1, 1, 1, false, 1},
      {"T", "naive, autotuned", 1, 1, 1, 1, false, 1, true},
  };
  return layouts;
}

// What one run measured.
struct Sample {
  double wall_s = 0;
  double steps = 0;
  double images_per_s = 0;
  double step_ms = 0;          // wall / steps
  double student_wait_ms = 0;  // train_step starved x wall / steps
  double teacher_wait_ms = 0;  // teacher_infer starved x wall / steps
  double teacher_ms = 0;       // teacher_infer busy per batch
  double forward_ms = 0, backward_ms = 0, optimizer_ms = 0;
  double cpu_per_wall = 0;     // this process's CPU time / wall: cores it kept busy
  double others_per_wall = 0;  // CPU time of everything else on the machine / wall
  std::string layout, verdict;
  double tuned_images_per_s = 0;  // autotune: images/s after the trials
  double tuning_s = 0;            // autotune: the trials' wall time
  std::string chosen;             // autotune: what it kept
  std::string trials;             // autotune: its trial table
};

// A fresh folder under the system temp dir, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "flowtrain-bench-kd-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw flowtrain::Error("cannot create a temp dir");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::size_t count_images(const std::string& root) {
  std::size_t n = 0;
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(root)) {
    std::string ext = e.path().extension().string();
    std::transform(ext.begin(), ext.end(), ext.begin(), ::tolower);
    if (e.is_regular_file() && (ext == ".jpg" || ext == ".jpeg")) ++n;
  }
  return n;
}

// The config of one run of `steps` batches: `limit` images per epoch, `epochs` passes.
std::string config_yaml(const Layout& l,
                        const std::string& data,
                        const std::string& teacher,
                        std::size_t limit,
                        std::size_t epochs,
                        const std::string& autocast) {
  const auto s = [](auto v) { return std::to_string(v); };
  const std::string cache =
      l.cached ? "  - {type: teacher_cache, queue_capacity: 2, params: {path: '" + teacher +
                     ".ftc', model: '" + teacher + "', autocast: " + autocast + "}}\n"
               : "";
  const std::string miss = l.cached ? "inputs: teacher_cache.miss, " : "";
  const std::string merge =
      l.cached ? "  - {type: merge, queue_capacity: 2, inputs: [teacher_cache.hit, teacher_infer]}\n"
               : "";
  // Batches in flight: 2 queued for each of teacher (cache), teacher_infer, merge, train_step,
  // 1 stepping, 1 being filled.
  const std::string pool = l.cached ? "12" : "8";
  return "threads: " + s(l.threads) +
         "\ncores: 2\n" +
         (l.autotune ? "autotune: {warmup_s: 0.5, trial_s: 1.5, max_trials: 8}\n" : "") +
         "stages:\n"
         "  - {type: image_folder, name: source, params: {root: '" +
         data + "', epochs: " + s(epochs) + ", limit: " + s(limit) +
         ", seed: 1}}\n"
         "  - {type: jpeg_decode, concurrency: " + s(l.data_concurrency) + "}\n" +
         "  - {type: augment, concurrency: " + s(l.data_concurrency) + ", params: {size: " +
         s(kImageSize) +
         ", scale: [0.5, 1.0], seed: 1}}\n"
         "  - {type: collate, params: {batch_size: " +
         s(kBatch) +
         ", drop_last: true, pool_size: " + pool + "}}\n" +
         cache + "  - {type: teacher_infer, " + miss + "concurrency: " +
         s(l.teacher_concurrency) + ", queue_capacity: 2, params: {model: '" + teacher +
         "', intraop_threads: " + s(l.teacher_intraop) + ", autocast: " + autocast + "}}\n" +
         merge +
         "  - {type: train_step, queue_capacity: 2, params: {model: vit_cpu_student, "
         "image_size: " +
         s(kImageSize) + ", classes: " + s(kClasses) +
         ", alpha: 0.5, temperature: 2, lr: 0.001, intraop_threads: " + s(l.student_intraop) +
         ", autocast: " + autocast + "}}\n";
}

const flowtrain::StageReport& stage(const flowtrain::RunReport& r, const std::string& name) {
  for (const flowtrain::StageReport& s : r.stages) {
    if (s.name == name) return s;
  }
  throw flowtrain::Error("no stage '" + name + "' in the report");
}

// CPU seconds the whole machine has spent busy (not idle or waiting for I/O), from /proc/stat.
double machine_busy_s() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  in >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
  return (user + nice + system + irq + softirq + steal) /
         static_cast<double>(::sysconf(_SC_CLK_TCK));
}

double process_cpu_s() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

Sample run_once(const Layout& l,
                const std::string& data,
                std::size_t images,
                const std::string& teacher,
                std::size_t batches,
                const std::string& autocast) {
  const std::size_t need = batches * kBatch;
  const std::size_t limit = std::min(images, need);
  const std::size_t epochs = (need + limit - 1) / limit;
  flowtrain::PipelineConfig config = flowtrain::parse_pipeline_config(
      config_yaml(l, data, teacher, limit, epochs, autocast), "layout " + l.key);
  const double machine_before = machine_busy_s(), cpu_before = process_cpu_s();
  std::optional<flowtrain::AutotuneReport> rehearsed = flowtrain::autotune_rehearse(config);
  std::unique_ptr<flowtrain::Pipeline> pipeline = flowtrain::build_pipeline(config);
  const flowtrain::RunReport r = flowtrain::autotune_run(
      *pipeline, config.run, flowtrain::stage_decls(config), std::move(rehearsed));
  const double cpu = process_cpu_s() - cpu_before, machine = machine_busy_s() - machine_before;

  const flowtrain::StageReport& t = stage(r, "teacher_infer");
  const flowtrain::StageReport& st = stage(r, "train_step");
  Sample s;
  s.wall_s = r.wall_s;
  const std::optional<flowtrain::StepTimes> times = flowtrain::step_times(st);
  if (!times) throw flowtrain::Error("layout " + l.key + ": 'train_step' reports no step times");
  s.steps = times->steps;
  if (s.steps <= 0) throw flowtrain::Error("layout " + l.key + ": the student took no step");
  // Rehearsals (autotune timing the student's threads on throwaway copies) run before the
  // run's own wall: the whole-run rate counts them.
  const double rehearsal_s = r.autotune ? r.autotune->rehearsal_s : 0;
  s.images_per_s = s.steps * kBatch / (r.wall_s + rehearsal_s);
  s.step_ms = 1e3 * r.wall_s / s.steps;
  s.student_wait_ms = 1e3 * st.starved_fraction * r.wall_s / s.steps;
  s.teacher_wait_ms = 1e3 * t.starved_fraction * r.wall_s / s.steps;
  s.teacher_ms = t.items_in > 0 ? 1e3 * t.busy_s / static_cast<double>(t.items_in) : 0;
  s.forward_ms = times->forward_ms;
  s.backward_ms = times->backward_ms;
  s.optimizer_ms = times->optimizer_ms;
  s.cpu_per_wall = cpu / (r.wall_s + rehearsal_s);
  s.others_per_wall = std::max(0.0, machine - cpu) / (r.wall_s + rehearsal_s);
  s.layout = r.layout();
  s.verdict = r.verdict();
  if (r.autotune) {
    const flowtrain::AutotuneReport& a = *r.autotune;
    // The rate once tuned: the images and time after the trials.
    s.tuned_images_per_s = (s.steps * kBatch - static_cast<double>(a.tuning_items)) /
                           (r.wall_s - a.tuning_s);
    s.tuning_s = a.tuning_s + a.rehearsal_s;
    if (const flowtrain::AutotuneTrial* chosen = a.chosen()) {
      s.chosen = "chosen in " + std::to_string(a.trials.size()) + " trials: " + chosen->layout;
    }
    s.trials = flowtrain::format_autotune(a);
  }
  return s;
}

std::string fixed(double v, int decimals) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  in >> one >> five >> fifteen;
  return one + " " + five + " " + fifteen;
}

int usage() {
  std::cerr << "usage: bench_kd [--steps N] [--reps N] [--warmup N] [--layouts A,B,C] "
               "[--data FOLDER] [--autocast none|bf16]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  flowtrain::keep_freed_memory();  // as the apps run (runner::run_phases)
  std::size_t steps = 20;
  int reps = 3;
  std::size_t warmup = 3;
  std::string layout_keys = "A,B,C";
  std::string data;
  std::string autocast = "none";
  std::string command = argv[0];
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) return usage();
    const char* value = argv[++i];
    if (arg == "--steps") {
      steps = static_cast<std::size_t>(std::max(1, std::atoi(value)));
    } else if (arg == "--reps") {
      reps = std::max(1, std::atoi(value));
    } else if (arg == "--warmup") {
      warmup = static_cast<std::size_t>(std::max(0, std::atoi(value)));
    } else if (arg == "--layouts") {
      layout_keys = value;
    } else if (arg == "--data") {
      data = value;
    } else if (arg == "--autocast" && (std::string(value) == "none" || std::string(value) == "bf16")) {
      autocast = value;
    } else {
      return usage();
    }
  }
  std::vector<Layout> layouts;
  for (std::size_t pos = 0; pos <= layout_keys.size();) {
    const std::size_t comma = std::min(layout_keys.find(',', pos), layout_keys.size());
    const std::string key = layout_keys.substr(pos, comma - pos);
    const auto it = std::find_if(all_layouts().begin(), all_layouts().end(),
                                 [&](const Layout& l) { return l.key == key; });
    if (it == all_layouts().end()) {
      std::cerr << "bench_kd: unknown layout '" << key << "' (known: A, B, C, D, N, T)\n";
      return 2;
    }
    layouts.push_back(*it);
    pos = comma + 1;
  }

  try {
    const auto t0 = std::chrono::steady_clock::now();
    TempDir tmp;
    std::size_t images = 0;
    const bool generated = data.empty();
    if (generated) {
      flowtrain::data::SyntheticOptions options;
      options.root = tmp.path() + "/images";
      options.count = steps * kBatch;
      options.width = options.height = kSyntheticSide;
      options.classes = kClasses;
      options.seed = 1;
      flowtrain::data::generate_jpeg_dataset(options);
      data = options.root;
      images = options.count;
    } else {
      images = count_images(data);
      if (images == 0) throw flowtrain::Error("no .jpg/.jpeg files under " + data);
    }
    const std::string teacher = tmp.path() + "/teacher.pt";
    {
      flowtrain::train::ImageModel model = flowtrain::train::make_model(
          flowtrain::train::model_config("vit_cpu_teacher", kImageSize, kClasses));
      flowtrain::train::save_checkpoint(teacher, model, nullptr, {});
    }

    std::printf("# bench_kd\n\n");
    std::printf("- **Command:** `%s`\n", command.c_str());
    std::printf("- **Date:** %s\n", now_utc().c_str());
    std::printf("- **Machine:** %u cores (nproc), %s; LibTorch %s\n",
                std::thread::hardware_concurrency(), flowtrain::bench::cpu_description().c_str(),
                TORCH_VERSION);
    std::printf("- **Load average at start:** %s\n", load_average().c_str());
    std::string env;
    for (const char* name : {"OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT",
                             "OMP_PROC_BIND", "OPENBLAS_NUM_THREADS"}) {
      if (const char* v = std::getenv(name))
        env += std::string(env.empty() ? "" : ", ") + name + "=" + v;
    }
    std::printf("- **Environment:** %s\n",
                env.empty() ? "no OpenMP/BLAS variables set" : env.c_str());
    std::printf(
        "- **Data:** %s (%zu JPEGs%s), %d px crops, batch %d; %zu steps per run, "
        "%zu warm-up steps per layout, %d rounds\n",
        data.c_str(), images,
        generated ? (", synthetic " + std::to_string(kSyntheticSide) + "x" +
                     std::to_string(kSyntheticSide) + ", " + std::to_string(kClasses) + " classes")
                        .c_str()
                  : "",
        kImageSize, kBatch, steps, warmup, reps);
    std::printf(
        "- **Models:** teacher vit_cpu_teacher (dim 384, depth 6, heads 6), student "
        "vit_cpu_student (dim 192, depth 4, heads 3), patch 16, alpha 0.5; autocast %s\n\n",
        autocast.c_str());
    std::fflush(stdout);

    for (const Layout& l : layouts) {
      if (l.cached) {
        // Fills the cache with the views of the timed runs, and says how fast that was.
        const Sample fill = run_once(l, data, images, teacher, steps, autocast);
        std::printf("Layout %s filled its teacher cache with %zu views at %.1f images/s.\n\n",
                    l.key.c_str(), steps * kBatch, fill.images_per_s);
      } else if (warmup > 0) {
        run_once(l, data, images, teacher, warmup, autocast);
      }
    }

    // One row per round: each layout's images/s, the others' CPU/wall during that run (how
    // loaded the machine was), and the ratios to the first layout within the round.
    std::map<std::string, std::vector<Sample>> samples;
    std::string header = "| round |", rule = "|---:|";
    for (const Layout& l : layouts) {
      header += " " + l.key + " images/s | " + l.key + " others' CPU/wall |";
      rule += "---:|---:|";
    }
    for (std::size_t i = 1; i < layouts.size(); ++i) {
      header += " " + layouts[i].key + "/" + layouts[0].key + " |", rule += "---:|";
    }
    std::printf("%s\n%s\n", header.c_str(), rule.c_str());
    std::map<std::string, std::vector<double>> ratios;
    for (int round = 1; round <= reps; ++round) {
      std::printf("| %d |", round);
      for (const Layout& l : layouts) {
        samples[l.key].push_back(run_once(l, data, images, teacher, steps, autocast));
        std::printf(" %.1f | %.2f |", samples[l.key].back().images_per_s,
                    samples[l.key].back().others_per_wall);
        std::fflush(stdout);
      }
      const double base = samples[layouts[0].key].back().images_per_s;
      for (std::size_t i = 1; i < layouts.size(); ++i) {
        const double ratio = samples[layouts[i].key].back().images_per_s / base;
        ratios[layouts[i].key].push_back(ratio);
        std::printf(" %.2f |", ratio);
      }
      std::printf("\n");
      std::fflush(stdout);
    }

    std::printf("\nMedians over %d rounds, per student step in ms:\n\n", reps);
    std::printf(
        "| layout | threads | teacher intra-op x conc | student intra-op | images/s | "
        "vs %s | step | student waits | teacher waits | teacher | forward | backward | "
        "optimizer | CPU/wall | others' CPU/wall |\n",
        layouts[0].key.c_str());
    std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (const Layout& l : layouts) {
      const std::vector<Sample>& v = samples[l.key];
      const auto med = [&](double Sample::*field) {
        std::vector<double> x;
        for (const Sample& s : v) x.push_back(s.*field);
        return median(x);
      };
      std::printf(
          "| %s %s | %zu | %d x %d | %d | %.1f | %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | "
          "%.1f | %.2f | %.2f |\n",
          l.key.c_str(), l.name.c_str(), l.threads, l.teacher_intraop, l.teacher_concurrency,
          l.student_intraop, med(&Sample::images_per_s),
          ratios.count(l.key) ? fixed(median(ratios[l.key]), 2).c_str() : "1.00",
          med(&Sample::step_ms), med(&Sample::student_wait_ms), med(&Sample::teacher_wait_ms),
          med(&Sample::teacher_ms), med(&Sample::forward_ms), med(&Sample::backward_ms),
          med(&Sample::optimizer_ms), med(&Sample::cpu_per_wall), med(&Sample::others_per_wall));
    }

    std::printf("\nLayout and verdict of each layout's median run (by images/s):\n\n");
    for (const Layout& l : layouts) {
      std::vector<Sample> v = samples[l.key];
      std::sort(v.begin(), v.end(),
                [](const Sample& a, const Sample& b) { return a.images_per_s < b.images_per_s; });
      const Sample& m = v[v.size() / 2];
      std::printf("- **%s %s** (%.0f steps, %.1f s): layout: %s; verdict: %s\n", l.key.c_str(),
                  l.name.c_str(), m.steps, m.wall_s, m.layout.c_str(), m.verdict.c_str());
      if (l.autotune) {
        const auto med = [&](double Sample::*field) {
          std::vector<double> x;
          for (const Sample& s : v) x.push_back(s.*field);
          return median(x);
        };
        std::printf("  autotune (medians): %.1f s of trials; %.1f images/s after them; median "
                    "run %s\n",
                    med(&Sample::tuning_s), med(&Sample::tuned_images_per_s), m.chosen.c_str());
        std::printf("\n  Its trials:\n\n```\n%s```\n", m.trials.c_str());
      }
    }
    std::printf("\nLoad average at end: %s; total %.0f s\n", load_average().c_str(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_kd: error: " << e.what() << "\n";
    return 1;
  }
}
