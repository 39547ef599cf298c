// profile_kd: where the time of one bench-small distillation step goes, by operator.
//
// The step of bench_kd without the graph around it: a random batch of 64 images at 112 px, the
// teacher (vit_cpu_teacher, loaded from a checkpoint through InferenceModel, as teacher_infer
// does) forward, then the student's (vit_cpu_student) forward, loss, backward and AdamW through
// a Trainer, as train_step, grad_sync and optimizer_step do, all on the calling thread with
// --threads intra-op threads (bench_kd's layout A). It first times --steps steps with no
// profiler (medians per part), then records --steps more with LibTorch's profiler and splits
// each part's time by operator self time into classes:
//
//   GEMM       matrix products and the patch convolution (addmm, mm, bmm, convolution...)
//   cast/copy  dtype conversions and copies (_to_copy, copy_, clone, contiguous)
//   norm/act   LayerNorm, softmax, log-softmax, GELU and their backward
//   other ops  the rest: additions, the optimizer's elementwise math, reductions, allocation
//   between    the part's wall time outside any operator (autograd bookkeeping, the framework)
//
// and prints the GEMMs' achieved GFLOP/s (the products' FLOPs, ModelConfig::forward_flops and
// train_flops, over their self time) and the operators that took most. --gemm 1 first prints
// the rate of each Linear product of the two models alone, in float32 and bfloat16: the
// machine's ceiling for these shapes.
// With two threads an operator's self time includes OpenMP's team waiting at its barriers.
//
// Run: build/bench/profile_kd [--autocast none|bf16] [--threads 2] [--steps 5] [--warmup 3]
//        [--top 15] [--gemm 0|1] [--teacher-weights cast-once|per-call]
// --teacher-weights per-call runs a bf16 teacher with float32 parameters under autocast, which
// casts them on every call, as teacher_infer did before they were cast once at load (the same
// outputs; the time the casts take).
#include <ATen/record_function.h>
#include <sys/resource.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "bench/bench_util.hpp"
#include "distributed/torch_compat.hpp"
#include "graph/error.hpp"
#include "graph/freed_memory.hpp"
#include "stages/train/files/checkpoint.hpp"
#include "stages/train/inference/inference_model.hpp"
#include "stages/train/models/compute.hpp"
#include "stages/train/models/vit.hpp"
#include "stages/train/step/trainer.hpp"

namespace {

namespace prof = torch::autograd::profiler;
namespace prof_impl = torch::profiler::impl;
using flowtrain::train::ModelConfig;
using Clock = std::chrono::steady_clock;
using flowtrain::bench::median;

constexpr int kImageSize = 112;
constexpr int kBatch = 64;
constexpr int kClasses = 10;

// The parts of a step, as user scopes in the profile.
constexpr const char* kParts[] = {"teacher forward", "student forward", "student backward",
                                  "optimizer"};

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// Minor page faults of this process so far: first touches of memory the allocator got fresh
// from the kernel, slow on these VMs.
double minor_faults() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_minflt);
}

std::string op_class(const std::string& name) {
  static const std::set<std::string> gemm = {"aten::addmm",
                                             "aten::mm",
                                             "aten::bmm",
                                             "aten::baddbmm",
                                             "aten::_convolution",
                                             "aten::mkldnn_convolution",
                                             "aten::convolution_backward",
                                             "aten::mkldnn_linear",
                                             "aten::_mkldnn_linear_backward"};
  static const std::set<std::string> cast = {"aten::_to_copy", "aten::copy_", "aten::clone",
                                             "aten::contiguous", "aten::to"};
  static const std::set<std::string> norm = {"aten::native_layer_norm",
                                             "aten::native_layer_norm_backward",
                                             "aten::_softmax",
                                             "aten::_softmax_backward_data",
                                             "aten::_log_softmax",
                                             "aten::_log_softmax_backward_data",
                                             "aten::gelu",
                                             "aten::gelu_backward"};
  if (gemm.count(name)) return "GEMM";
  if (cast.count(name)) return "cast/copy";
  if (norm.count(name)) return "norm/act";
  return "other ops";
}

// One profiled operator or scope, with its self time (its duration minus its children's).
struct Event {
  std::string name;
  std::uint64_t thread = 0, start = 0, end = 0;
  double self_us = 0;
  std::string part;  // the enclosing kParts scope, or empty
};

std::vector<Event> events_with_self_time(const prof::ProfilerResult& result) {
  std::vector<Event> events;
  for (const prof::KinetoEvent& e : result.events()) {
    if (e.deviceType() != c10::DeviceType::CPU) continue;
    const std::uint64_t start = flowtrain::dist::event_start_us(e),
                        duration = flowtrain::dist::event_duration_us(e);
    events.push_back({e.name(), e.startThreadId(), start, start + duration,
                      static_cast<double>(duration), ""});
  }
  // Nest by time on each thread: parents start earlier (or end later at the same start).
  std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    if (a.thread != b.thread) return a.thread < b.thread;
    if (a.start != b.start) return a.start < b.start;
    return a.end > b.end;
  });
  std::vector<Event*> stack;
  for (Event& e : events) {
    while (!stack.empty() && (stack.back()->thread != e.thread || stack.back()->end <= e.start)) {
      stack.pop_back();
    }
    if (!stack.empty()) {
      stack.back()->self_us -= static_cast<double>(e.end - e.start);
      e.part = stack.back()->part;
    }
    for (const char* part : kParts) {
      if (e.name == part) e.part = part;
    }
    stack.push_back(&e);
  }
  return events;
}

// GFLOP/s of x [m, k] times w^T for w [n, k] (a Linear layer's product, as at::linear runs it)
// on the calling thread's intra-op threads, median of 15 after 3 warm-ups.
double linear_gflops(std::int64_t m, std::int64_t k, std::int64_t n, torch::ScalarType dtype) {
  const torch::Tensor x = torch::randn({m, k}).to(dtype);
  const torch::Tensor w = torch::randn({n, k}).to(dtype);
  std::vector<double> ms;
  for (int i = 0; i < 18; ++i) {
    const Clock::time_point t = Clock::now();
    const torch::Tensor y = torch::mm(x, w.t());
    if (i >= 3) ms.push_back(ms_since(t));
  }
  return 2.0 * static_cast<double>(m * k * n) / median(ms) / 1e6;
}

int usage() {
  std::cerr << "usage: profile_kd [--autocast none|bf16] [--threads N] [--steps N] [--warmup N] "
               "[--top N] [--gemm 0|1] [--teacher-weights cast-once|per-call]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  flowtrain::keep_freed_memory();  // as the apps run (runner::run_phases)
  std::string autocast = "none", teacher_weights = "cast-once";
  int threads = 2, steps = 5, warmup = 3, top = 15;
  bool gemm_table = false;
  std::string command = argv[0];
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i], value = argv[i + 1];
    if (arg == "--autocast" && (value == "none" || value == "bf16")) {
      autocast = value;
    } else if (arg == "--teacher-weights" && (value == "cast-once" || value == "per-call")) {
      teacher_weights = value;
    } else if (arg == "--threads") {
      threads = std::max(1, std::atoi(value.c_str()));
    } else if (arg == "--steps") {
      steps = std::max(1, std::atoi(value.c_str()));
    } else if (arg == "--warmup") {
      warmup = std::max(0, std::atoi(value.c_str()));
    } else if (arg == "--gemm" && (value == "0" || value == "1")) {
      gemm_table = value == "1";
    } else if (arg == "--top") {
      top = std::max(1, std::atoi(value.c_str()));
    } else {
      return usage();
    }
  }
  if (argc % 2 == 0) return usage();

  try {
    namespace train = flowtrain::train;
    const bool bf16 = train::wants_bf16(autocast);
    const ModelConfig teacher_config = train::model_config("vit_cpu_teacher", kImageSize, kClasses);
    const ModelConfig student_config = train::model_config("vit_cpu_student", kImageSize, kClasses);
    const std::string teacher_path =
        (std::filesystem::temp_directory_path() /
         ("flowtrain-profile-kd-" + std::to_string(::getpid()) + ".pt"))
            .string();
    {
      torch::manual_seed(1);
      train::ImageModel model = train::make_model(teacher_config);
      train::save_checkpoint(teacher_path, model, nullptr, {});
    }
    // teacher_infer's way (weights cast once), or casting them on every call as before.
    const bool cast_per_call = bf16 && teacher_weights == "per-call";
    const std::unique_ptr<train::InferenceModel> teacher = train::InferenceModel::load(
        teacher_path, bf16 && !cast_per_call ? train::InferenceModel::Precision::kBFloat16
                                             : train::InferenceModel::Precision::kFloat32);
    std::filesystem::remove(teacher_path);
    train::Trainer student(
        {.model = student_config, .seed = 1, .autocast = bf16 ? c10::kBFloat16 : c10::kFloat});
    student.set_total_steps(static_cast<std::uint64_t>(warmup + 2 * steps));

    torch::manual_seed(2);
    flowtrain::data::Batch batch;
    batch.images = torch::randn({kBatch, 3, kImageSize, kImageSize});
    batch.labels = torch::randint(kClasses, {kBatch}, torch::kLong);
    batch.targets = torch::empty({kBatch, 0});

    train::IntraOpThreads intraop(threads);
    std::map<std::string, std::vector<double>> timed;  // part -> ms per step
    const auto step = [&](bool record) {
      Clock::time_point t = Clock::now();
      {
        RECORD_USER_SCOPE(kParts[0]);
        train::Autocast per_call(cast_per_call ? c10::kBFloat16 : c10::kFloat);
        batch.teacher_logits = teacher->forward(batch.images).logits.to(torch::kFloat);
      }
      if (record) timed[kParts[0]].push_back(ms_since(t));
      t = Clock::now();
      student.forward_backward(batch);  // marks its own parts
      student.sync_bucket(0);
      const double fwd_bwd = ms_since(t);
      t = Clock::now();
      student.apply();
      if (record) {
        timed["student forward + backward"].push_back(fwd_bwd);
        timed[kParts[3]].push_back(ms_since(t));
      }
    };
    for (int i = 0; i < warmup; ++i) step(false);
    const double faults_before = minor_faults();
    for (int i = 0; i < steps; ++i) step(true);
    const double faults_per_step = (minor_faults() - faults_before) / steps;

    std::printf(
        "# profile_kd\n\n- **Command:** `%s`\n- **CPU:** %s\n- **LibTorch:** %s; intra-op threads "
        "%d; "
        "autocast %s (teacher weights %s); batch %d at %d px\n",
        command.c_str(), flowtrain::bench::cpu_description().c_str(), TORCH_VERSION, threads,
        autocast.c_str(), bf16 ? teacher_weights.c_str() : "float32", kBatch, kImageSize);
    const double teacher_flops = static_cast<double>(teacher_config.forward_flops());
    const double student_flops = static_cast<double>(student_config.train_flops());
    std::printf(
        "- **FLOPs per image (from the shapes):** teacher forward %.3f G, student forward "
        "+ backward %.3f G\n\n",
        teacher_flops / 1e9, student_flops / 1e9);
    if (gemm_table) {
      // The ceiling of these shapes: the teacher's and student's Linear products at this batch.
      std::printf(
          "| product [m, k] x [k, n] | float32 GFLOP/s | bfloat16 GFLOP/s |\n"
          "|---|---:|---:|\n");
      const std::int64_t m = kBatch * (teacher_config.patches() + 1);
      std::vector<std::pair<std::int64_t, std::int64_t>> shapes;  // (k, n)
      for (const ModelConfig& c : {teacher_config, student_config}) {
        const std::int64_t d = c.dim, h = c.mlp_hidden();
        shapes.insert(shapes.end(), {{d, 3 * d}, {d, d}, {d, h}, {h, d}});
      }
      shapes.emplace_back(1024, 1024);  // a square reference
      for (const auto& [k, n] : shapes) {
        std::printf("| [%ld, %ld] x [%ld, %ld] | %.0f | %.0f |\n", m, k, k, n,
                    linear_gflops(m, k, n, torch::kFloat),
                    linear_gflops(m, k, n, torch::kBFloat16));
      }
      std::printf("\n");
    }
    std::printf(
        "Without the profiler, medians of %d steps:\n\n| part | ms per step | GFLOP/s "
        "|\n|---|---:|---:|\n",
        steps);
    const double t_ms = median(timed[kParts[0]]);
    const double s_ms = median(timed["student forward + backward"]);
    const double o_ms = median(timed[kParts[3]]);
    std::printf("| teacher forward | %.1f | %.0f |\n", t_ms, teacher_flops * kBatch / t_ms / 1e6);
    std::printf("| student forward + backward | %.1f | %.0f |\n", s_ms,
                student_flops * kBatch / s_ms / 1e6);
    std::printf("| optimizer | %.1f | |\n", o_ms);
    std::printf("| **step** | **%.1f** (%.0f images/s) | %.0f |\n\n", t_ms + s_ms + o_ms,
                1e3 * kBatch / (t_ms + s_ms + o_ms),
                (teacher_flops + student_flops) * kBatch / (t_ms + s_ms + o_ms) / 1e6);
    std::printf("Minor page faults per step: %.0f (%.0f MiB first touched)\n\n", faults_per_step,
                faults_per_step * static_cast<double>(::sysconf(_SC_PAGESIZE)) / (1 << 20));

    // The profiled steps. Recording input shapes (and so FLOPs) would make copy_ look several
    // times slower than it runs; the GEMMs' rate comes from the model's FLOPs instead.
    const prof_impl::ProfilerConfig config(prof_impl::ProfilerState::KINETO,
                                           /*report_input_shapes=*/false, /*profile_memory=*/false,
                                           /*with_stack=*/false, /*with_flops=*/false);
    const std::set<prof_impl::ActivityType> activities = {prof_impl::ActivityType::CPU};
    prof::prepareProfiler(config, activities);
    prof::enableProfiler(config, activities);
    for (int i = 0; i < steps; ++i) step(false);
    const std::unique_ptr<prof::ProfilerResult> result = prof::disableProfiler();

    const std::vector<Event> events = events_with_self_time(*result);
    // The products' FLOPs of each part, per step.
    const double teacher_forward = teacher_flops * kBatch;
    const double student_forward = static_cast<double>(student_config.forward_flops()) * kBatch;
    const std::map<std::string, double> part_flops = {
        {kParts[0], teacher_forward},
        {kParts[1], student_forward},
        {kParts[2], student_flops * kBatch - student_forward}};
    std::map<std::string, double> part_wall;                     // part -> us
    std::map<std::string, std::map<std::string, double>> split;  // part -> class -> self us
    std::map<std::string, std::pair<double, int>> ops;           // "part: op" -> (self us, calls)
    for (const Event& e : events) {
      if (e.part.empty()) continue;
      if (e.name == e.part) {
        part_wall[e.part] += static_cast<double>(e.end - e.start);
        split[e.part]["between"] += e.self_us;
        continue;
      }
      split[e.part][op_class(e.name)] += e.self_us;
      auto& op = ops[e.part + ": " + e.name];
      op.first += e.self_us;
      op.second += 1;
    }
    const char* classes[] = {"GEMM", "cast/copy", "norm/act", "other ops", "between"};
    std::printf(
        "With the profiler, %d steps, ms per step by operator self time (share of the "
        "part):\n\n| part | wall |",
        steps);
    for (const char* c : classes) std::printf(" %s |", c);
    std::printf(" GEMM GFLOP/s |\n|---|---:|---:|---:|---:|---:|---:|---:|\n");
    double total_wall = 0;
    std::map<std::string, double> total_split;
    for (const char* part : kParts) {
      const double wall = part_wall[part];
      total_wall += wall;
      std::printf("| %s | %.1f |", part, wall / 1e3 / steps);
      for (const char* c : classes) {
        total_split[c] += split[part][c];
        std::printf(" %.1f (%.0f%%) |", split[part][c] / 1e3 / steps,
                    wall > 0 ? 100 * split[part][c] / wall : 0);
      }
      const double gemm_us = split[part]["GEMM"];
      const auto flops = part_flops.find(part);
      if (gemm_us > 0 && flops != part_flops.end()) {
        std::printf(" %.0f |\n", flops->second * steps / gemm_us / 1e3);
      } else {
        std::printf(" |\n");
      }
    }
    std::printf("| **step** | **%.1f** |", total_wall / 1e3 / steps);
    for (const char* c : classes) {
      std::printf(" %.1f (%.0f%%) |", total_split[c] / 1e3 / steps,
                  total_wall > 0 ? 100 * total_split[c] / total_wall : 0);
    }
    std::printf(" %.0f |\n\n",
                (teacher_flops + student_flops) * kBatch * steps / total_split["GEMM"] / 1e3);

    std::vector<std::pair<std::string, std::pair<double, int>>> sorted(ops.begin(), ops.end());
    std::sort(sorted.begin(), sorted.end(),
              [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
    std::printf(
        "The %d operators with the most self time:\n\n| part: operator | ms per step | "
        "calls per step | class |\n|---|---:|---:|---|\n",
        top);
    for (int i = 0; i < top && i < static_cast<int>(sorted.size()); ++i) {
      const std::string& key = sorted[i].first;
      std::printf("| %s | %.2f | %d | %s |\n", key.c_str(), sorted[i].second.first / 1e3 / steps,
                  sorted[i].second.second / steps,
                  op_class(key.substr(key.find(": ") + 2)).c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "profile_kd: " << e.what() << "\n";
    return 1;
  }
}
