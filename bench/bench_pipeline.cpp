// bench_pipeline: pipeline model parallelism in one process, against the same model on all the
// cores. A ViT-Ti (dim 192, depth 12, heads 3, 16 px patches) at 112 px, batch 64, random
// images and labels, AdamW; each step is one batch:
//   whole      the model unsplit, one thread on `--threads` intra-op threads (2)
//   <schedule> M=<m>  the model split in 2 stages at block 6, one rank thread each on 1
//              intra-op thread, the batch in M micro-batches (interleaved: 4 stages, 2 a rank)
// For each: images/s (median of the rounds), the bubble measured (1 - busy / (ranks x wall),
// median) against the textbook (P - 1) / (M + P - 1) for GPipe and 1F1B and the schedule's
// simulation with a backward costing twice a forward, and the most micro-batches whose
// activations a stage kept. Layouts run in turn, --reps rounds of --steps
// steps after one warm-up round.
//
// Run: build/bench/bench_pipeline [--steps 6] [--reps 3] [--threads 2]   (float32)
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/bench_util.hpp"
#include "graph/freed_memory.hpp"
#include "stages/train/models/compute.hpp"
#include "stages/train/partitioned/batch_runner.hpp"

namespace {

using flowtrain::train::PartitionScheduleKind;
using Clock = std::chrono::steady_clock;

constexpr int kBatch = 64;

struct Layout {
  std::string name;
  bool whole = false;
  PartitionScheduleKind kind = PartitionScheduleKind::kGPipe;
  int microbatches = 1;
  int chunks = 1;  // stages per rank
};

struct Round {
  double images_per_s = 0;
  double bubble = 0;
  std::vector<int> peak;
};

int int_arg(int argc, char** argv, const std::string& name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (name == argv[i]) return std::atoi(argv[i + 1]);
  }
  return fallback;
}

Round run(const Layout& l, int steps, int threads) {
  using namespace flowtrain::train;
  torch::manual_seed(1);
  ViT model(model_config("vit_ti", 112, 10));
  model->train();
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-4));
  const torch::Tensor images = torch::randn({kBatch, 3, 112, 112});
  const torch::Tensor labels = torch::randint(0, 10, {kBatch}, torch::kLong);
  const PartitionSchedule schedule =
      make_partition_schedule(l.kind, 2, std::max(1, l.microbatches), l.chunks);
  const std::int64_t size = kBatch / std::max(1, l.microbatches);
  const std::vector<ModelStageFn> stages = vit_model_stages(
      model, balanced_splits(12, schedule.stages), [&](const ModelOutput& out, int m) {
        return torch::nn::functional::cross_entropy(out.logits,
                                                    labels.slice(0, m * size, (m + 1) * size));
      });
  Round r;
  std::vector<double> bubbles;
  const Clock::time_point begin = Clock::now();
  for (int step = 0; step < steps; ++step) {
    optimizer.zero_grad();
    if (l.whole) {
      IntraOpThreads scope(threads);
      torch::nn::functional::cross_entropy(model->forward(images).logits, labels).backward();
    } else {
      const PartitionedBatchResult b = run_partitioned_batch(
          schedule, stages, [&](int m) { return images.slice(0, m * size, (m + 1) * size); }, 1);
      bubbles.push_back(b.bubble);
      r.peak = b.peak_in_flight;
    }
    IntraOpThreads scope(threads);
    optimizer.step();
  }
  r.images_per_s = steps * kBatch / std::chrono::duration<double>(Clock::now() - begin).count();
  r.bubble = bubbles.empty() ? 0 : flowtrain::bench::median(bubbles);
  return r;
}

/// What `partition_balance: measured` sees on this model and picks, against counting blocks.
void print_measured_balance() {
  using namespace flowtrain::train;
  torch::manual_seed(1);
  ViT model(model_config("vit_ti", 112, 10));
  model->train();
  const std::vector<double> s = piece_seconds(*model, torch::randn({8, 3, 112, 112}), true);
  const auto [low, high] = std::minmax_element(s.begin() + 1, s.end() - 1);
  std::printf("\nMeasured balance (piece_seconds, forward + backward of 8 images, 1 "
              "thread): embedding %.2f ms, blocks %.2f-%.2f ms, heads %.2f ms\n\n",
              s.front() * 1e3, *low * 1e3, *high * 1e3, s.back() * 1e3);
  const auto text = [](const std::vector<int>& v) {
    std::string out;
    for (const int x : v) out += (out.empty() ? "" : ", ") + std::to_string(x);
    return "[" + out + "]";
  };
  std::printf("| stages | measured splits | counted splits |\n|---:|---|---|\n");
  for (const int stages : {2, 3, 4}) {
    std::printf("| %d | %s | %s |\n", stages, text(measured_splits(s, stages)).c_str(),
                text(balanced_splits(12, stages)).c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  flowtrain::keep_freed_memory();  // as the apps run (runner::run_phases)
  const int steps = int_arg(argc, argv, "--steps", 6);
  const int reps = int_arg(argc, argv, "--reps", 3);
  const int threads = int_arg(argc, argv, "--threads", 2);
  const std::vector<Layout> layouts = {
      {"whole (" + std::to_string(threads) + " intra-op)", true},
      {"gpipe M=4", false, PartitionScheduleKind::kGPipe, 4},
      {"gpipe M=8", false, PartitionScheduleKind::kGPipe, 8},
      {"1f1b M=4", false, PartitionScheduleKind::k1F1B, 4},
      {"1f1b M=8", false, PartitionScheduleKind::k1F1B, 8},
      {"interleaved M=8 (2 a rank)", false, PartitionScheduleKind::kInterleaved, 8, 2}};
  std::printf(
      "# bench_pipeline\n\n- **Command:** `build/bench/bench_pipeline --steps %d --reps %d "
      "--threads %d`\n- **Date:** %s\n- **Machine:** %s\n"
      "- **Model:** ViT-Ti (dim 192, depth 12, heads 3, patch 16) at 112 px, batch %d, "
      "AdamW, float32; split in 2 stages at block 6 (interleaved: 4 stages of 3 blocks)\n\n",
      steps, reps, threads, flowtrain::bench::now_utc().c_str(),
      flowtrain::bench::cpu_description().c_str(), kBatch);
  std::vector<std::vector<Round>> rounds(layouts.size());
  for (int rep = 0; rep <= reps; ++rep) {
    for (std::size_t i = 0; i < layouts.size(); ++i) {
      const Round r = run(layouts[i], rep == 0 ? 2 : steps, threads);
      if (rep > 0) rounds[i].push_back(r);
    }
  }
  std::printf(
      "| layout | images/s | vs whole | bubble measured | bubble textbook | bubble "
      "simulated | peak in flight (stage 0, 1, ...) |\n|---|---:|---:|---:|---:|---:|---|\n");
  double whole = 0;
  for (std::size_t i = 0; i < layouts.size(); ++i) {
    std::vector<double> rates, bubbles;
    for (const Round& r : rounds[i]) {
      rates.push_back(r.images_per_s);
      bubbles.push_back(r.bubble);
    }
    const double rate = flowtrain::bench::median(rates);
    if (i == 0) whole = rate;
    const Layout& l = layouts[i];
    std::string peak, textbook = "-", bubble = "-", simulated = "-";
    for (const int p : rounds[i].back().peak)
      peak += (peak.empty() ? "" : ", ") + std::to_string(p);
    if (!l.whole) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.3f", flowtrain::bench::median(bubbles));
      bubble = buf;
      if (l.chunks == 1) {
        std::snprintf(buf, sizeof buf, "%.3f",
                      flowtrain::train::textbook_bubble(2, l.microbatches));
        textbook = buf;
      }
      std::snprintf(buf, sizeof buf, "%.3f",
                    flowtrain::train::simulate_pipeline(flowtrain::train::make_partition_schedule(
                                                            l.kind, 2, l.microbatches, l.chunks))
                        .bubble);
      simulated = buf;
    }
    std::printf("| %s | %.1f | %.2f | %s | %s | %s | %s |\n", l.name.c_str(), rate, rate / whole,
                bubble.c_str(), textbook.c_str(), simulated.c_str(),
                peak.empty() ? "-" : peak.c_str());
  }
  print_measured_balance();
  return 0;
}
