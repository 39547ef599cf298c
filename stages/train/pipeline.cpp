#include "stages/train/pipeline.hpp"

#include <torch/autograd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <limits>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "graph/error.hpp"
#include "stages/train/compute.hpp"
#include "stages/train/thread_memory.hpp"

namespace flowtrain::train {

namespace {

using Kind = PipelineAction::Kind;
using Clock = std::chrono::steady_clock;

// Thrown in a rank waiting for a tensor once another rank failed: it stops without a message.
struct Cancelled {};

// Tensors handed between the ranks' threads of one process, each put once and taken once.
class Mailbox {
 public:
  void put(Kind kind, int stage, int microbatch, torch::Tensor tensor) {
    {
      std::lock_guard lock(mutex_);
      tensors_[{kind, stage, microbatch}] = std::move(tensor);
    }
    arrived_.notify_all();
  }

  torch::Tensor take(Kind kind, int stage, int microbatch) {
    std::unique_lock lock(mutex_);
    const std::tuple key{kind, stage, microbatch};
    arrived_.wait(lock, [&] { return failed_ || tensors_.count(key) != 0; });
    if (failed_) throw Cancelled{};
    torch::Tensor out = std::move(tensors_[key]);
    tensors_.erase(key);
    return out;
  }

  void fail() {
    {
      std::lock_guard lock(mutex_);
      failed_ = true;
    }
    arrived_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::map<std::tuple<Kind, int, int>, torch::Tensor> tensors_;
  bool failed_ = false;
};

std::string current_exception_text() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace

PipelineBatchResult run_pipeline_batch(const PipelineSchedule& schedule,
                                       const std::vector<PipelineStageFn>& stages,
                                       const std::function<torch::Tensor(int)>& input,
                                       int intraop_threads,
                                       const std::vector<double>& weights,
                                       PipelineTransport* transport) {
  if (stages.size() != static_cast<std::size_t>(schedule.stages)) {
    throw Error("the pipeline schedule has " + std::to_string(schedule.stages) +
                " stages, but the model was split into " + std::to_string(stages.size()));
  }
  const int m = schedule.microbatches, last = schedule.stages - 1;
  if (!weights.empty() && weights.size() != static_cast<std::size_t>(m)) {
    throw Error("run_pipeline_batch: " + std::to_string(weights.size()) + " loss weights for " +
                std::to_string(m) + " micro-batches");
  }
  const int ranks = static_cast<int>(schedule.actions.size());
  if (transport && (transport->rank() < 0 || transport->rank() >= ranks)) {
    throw Error("run_pipeline_batch: this process runs pipeline rank " +
                std::to_string(transport->rank()) + ", but the schedule has " +
                std::to_string(ranks) + " ranks");
  }
  const auto weight = [&](int microbatch) {
    return weights.empty() ? 1.0 / m : weights[static_cast<std::size_t>(microbatch)];
  };
  // What a stage keeps of a micro-batch from its forward to its backward (only the rank
  // holding the stage touches its entries).
  struct Kept {
    torch::Tensor input;   // a stage's input, as a leaf whose gradient goes back
    torch::Tensor output;  // with its autograd graph; the last stage's: the scaled loss
  };
  std::vector<Kept> kept(static_cast<std::size_t>(schedule.stages * m));
  PipelineBatchResult result;
  result.losses.assign(static_cast<std::size_t>(m), 0.0);
  result.spans.resize(schedule.actions.size());
  result.peak_in_flight.assign(static_cast<std::size_t>(schedule.stages), 0);
  result.peak_bytes.assign(schedule.actions.size(), 0);
  std::vector<int> in_flight(static_cast<std::size_t>(schedule.stages), 0);
  Mailbox mail;
  std::mutex error_mutex;
  std::string error;
  const Clock::time_point begin = result.start = Clock::now();
  const auto seconds = [&] { return std::chrono::duration<double>(Clock::now() - begin).count(); };

  // Stage s's forward output goes to stage s + 1 (kept under (kForward, s + 1, m)), the gradient
  // of its input back to stage s - 1 (under (kBackward, s - 1, m)): through the mailbox between
  // threads of this process, or through the transport to a rank in another one.
  const auto local = [&](int rank) { return !transport || rank == transport->rank(); };
  const auto tag = [&](Kind kind, int stage, int microbatch) {
    return ((kind == Kind::kForward ? 0 : schedule.stages) + stage) * m + microbatch;
  };
  const auto what = [](Kind kind, int stage, int microbatch) {
    const std::string s = std::to_string(stage);
    return (kind == Kind::kForward ? "stage " + s + "'s input"
                                   : "the gradient of stage " + s + "'s output") +
           " of micro-batch " + std::to_string(microbatch);
  };
  const auto put = [&](Kind kind, int stage, int microbatch, torch::Tensor tensor) {
    const int to = schedule.rank_of(stage);
    if (local(to)) {
      mail.put(kind, stage, microbatch, std::move(tensor));
    } else {
      transport->send(to, tag(kind, stage, microbatch), tensor.contiguous(),
                      what(kind, stage, microbatch));
    }
  };
  const auto take = [&](Kind kind, int stage, int microbatch) {
    const int from = schedule.rank_of(kind == Kind::kForward ? stage - 1 : stage + 1);
    return local(from)
               ? mail.take(kind, stage, microbatch)
               : transport->recv(from, tag(kind, stage, microbatch), what(kind, stage, microbatch));
  };

  const auto run_rank = [&](std::size_t rank) {
    IntraOpThreads threads(intraop_threads);
    const int slot = static_cast<int>(rank) % CountThreadMemory::kSlots;
    CountThreadMemory count(slot);
    thread_memory_reset_peak(slot);
    const std::int64_t held_before = thread_memory_live(slot);
    for (const PipelineAction& a : schedule.actions[rank]) {
      const auto s = static_cast<std::size_t>(a.stage);
      Kept& k = kept[s * static_cast<std::size_t>(m) + static_cast<std::size_t>(a.microbatch)];
      double start = 0;  // once its input is there: waiting for it is the bubble
      try {
        if (a.kind == Kind::kForward) {
          k.input = a.stage == 0 ? torch::Tensor()
                                 : take(Kind::kForward, a.stage, a.microbatch).requires_grad_();
          start = seconds();
          torch::Tensor y = stages[s](a.stage == 0 ? input(a.microbatch) : k.input, a.microbatch);
          if (a.stage == last) {
            result.losses[static_cast<std::size_t>(a.microbatch)] = y.item<double>();
            k.output = y * weight(a.microbatch);
          } else {
            put(Kind::kForward, a.stage + 1, a.microbatch, y.detach());
            k.output = std::move(y);
          }
          result.peak_in_flight[s] = std::max(result.peak_in_flight[s], ++in_flight[s]);
        } else {
          const torch::Tensor grad =
              a.stage == last ? torch::Tensor() : take(Kind::kBackward, a.stage, a.microbatch);
          start = seconds();
          if (a.stage == last) {
            torch::autograd::backward({k.output});
          } else {
            torch::autograd::backward({k.output}, {grad});
          }
          if (a.stage > 0) put(Kind::kBackward, a.stage - 1, a.microbatch, k.input.grad());
          k = {};  // the activations go as soon as the backward is done
          --in_flight[s];
        }
      } catch (const Cancelled&) {
        return;
      } catch (...) {
        {
          std::lock_guard lock(error_mutex);
          if (error.empty()) {
            error = "pipeline rank " + std::to_string(rank) + ", " +
                    (a.kind == Kind::kForward ? "forward" : "backward") + " of stage " +
                    std::to_string(a.stage) + ", micro-batch " + std::to_string(a.microbatch) +
                    ": " + current_exception_text();
          }
        }
        mail.fail();
        return;
      }
      result.spans[rank].emplace_back(start, seconds());
    }
    result.peak_bytes[rank] = thread_memory_peak(slot) - held_before;
  };
  install_memory_counting();  // before the ranks' threads allocate
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    if (local(r)) threads.emplace_back(run_rank, static_cast<std::size_t>(r));
  }
  for (std::thread& t : threads) t.join();
  if (!error.empty()) throw Error(error);
  if (transport) transport->flush();

  result.wall_s = seconds();
  double busy = 0, sum = 0;
  for (const auto& spans : result.spans) {
    for (const auto& [start, end] : spans) busy += end - start;
  }
  for (int i = 0; i < m; ++i) sum += weight(i) * result.losses[static_cast<std::size_t>(i)];
  result.loss = sum;
  result.bubble =
      result.wall_s > 0 ? 1 - busy / (static_cast<double>(threads.size()) * result.wall_s) : 0;
  return result;
}

std::vector<int> split_points_param(const std::vector<double>& values) {
  std::vector<int> out;
  for (const double split : values) {
    if (split != static_cast<int>(split) || split < 1) {
      throw Error("param 'partition_splits' must hold block indices (whole numbers >= 1)");
    }
    out.push_back(static_cast<int>(split));
  }
  return out;
}

std::vector<int> chunk_bounds(int blocks, const std::vector<int>& splits) {
  std::vector<int> bounds = {0};
  for (const int split : splits) {
    if (split <= bounds.back() || split >= blocks) {
      throw Error("pipeline split points must rise within 1 .. " + std::to_string(blocks - 1) +
                  " (the model has " + std::to_string(blocks) + " blocks), got " +
                  std::to_string(split) + " after " + std::to_string(bounds.back()));
    }
    bounds.push_back(split);
  }
  bounds.push_back(blocks);
  return bounds;
}

std::vector<PipelineStageFn> vit_pipeline_stages(
    ViT& model,
    const std::vector<int>& splits,
    std::function<torch::Tensor(const ModelOutput&, int)> loss) {
  const std::vector<int> bounds = chunk_bounds(model->blocks(), splits);
  std::vector<PipelineStageFn> out;
  const std::size_t count = bounds.size() - 1;
  for (std::size_t s = 0; s < count; ++s) {
    const int begin = bounds[s], end = bounds[s + 1];
    const bool first = s == 0, final = s + 1 == count;
    out.push_back(
        [model, begin, end, first, final, loss](const torch::Tensor& x, int microbatch) mutable {
          torch::Tensor tokens = model->run_blocks(first ? model->embed(x) : x, begin, end);
          return final ? loss(model->head(tokens), microbatch) : tokens;
        });
  }
  return out;
}

std::vector<int> vit_parameter_stages(ViT& model, const std::vector<int>& splits) {
  const int depth = model->blocks();
  std::vector<int> out;
  for (const auto& item : model->named_parameters()) {
    const int piece = model->piece_of(item.key());
    // The embedding's to the first stage, the head's to the last, block i's to the one
    // running it.
    out.push_back(piece == 0 ? 0
                             : static_cast<int>(std::upper_bound(splits.begin(), splits.end(),
                                                                 std::min(piece - 1, depth - 1)) -
                                                splits.begin()));
  }
  return out;
}

std::vector<int> balanced_splits(int depth, int stages) {
  if (stages < 1 || stages > depth) {
    throw Error("cannot split a model of " + std::to_string(depth) + " blocks into " +
                std::to_string(stages) + " pipeline stages");
  }
  std::vector<int> splits;
  for (int s = 1; s < stages; ++s) splits.push_back(s * depth / stages);
  return splits;
}

std::vector<double> piece_seconds(ImageModelImpl& model,
                                  const torch::Tensor& images,
                                  bool backward,
                                  int reps) {
  const int blocks = model.blocks();
  std::vector<std::vector<double>> samples(static_cast<std::size_t>(blocks) + 2);
  // Each piece from a detached input, so that its backward is its own.
  const auto timed = [backward](auto&& forward, const torch::Tensor& input,
                                std::vector<double>& into) {
    const auto begin = std::chrono::steady_clock::now();
    torch::Tensor out = forward(input);
    if (backward) out.backward(torch::ones_like(out));
    into.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count());
    return backward ? out.detach().requires_grad_(true) : out;
  };
  for (int rep = 0; rep <= reps; ++rep) {
    torch::Tensor x =
        timed([&](const torch::Tensor& in) { return model.embed(in); }, images, samples[0]);
    for (int b = 0; b < blocks; ++b) {
      x = timed([&](const torch::Tensor& in) { return model.run_blocks(in, b, b + 1); }, x,
                samples[static_cast<std::size_t>(b) + 1]);
    }
    timed(
        [&](const torch::Tensor& in) {
          const ModelOutput out = model.head(in);
          torch::Tensor sum = out.logits.sum();
          if (out.distillation.defined()) sum = sum + out.distillation.sum();
          if (out.regression.defined()) sum = sum + out.regression.sum();
          return sum;
        },
        x, samples.back());
  }
  std::vector<double> costs;
  for (std::vector<double>& s : samples) {
    s.erase(s.begin());  // the warm-up
    std::sort(s.begin(), s.end());
    costs.push_back(s[s.size() / 2]);
  }
  return costs;
}

std::vector<int> measured_splits(const std::vector<double>& costs, int stages) {
  const int depth = static_cast<int>(costs.size()) - 2;
  if (depth < 1 || stages < 1 || stages > depth) {
    throw Error("cannot split a model of " + std::to_string(std::max(depth, 0)) + " blocks into " +
                std::to_string(stages) + " pipeline stages");
  }
  // w[i]: block i's cost, the embedding's added to the first and the heads' to the last.
  std::vector<double> w(costs.begin() + 1, costs.end() - 1);
  w.front() += costs.front();
  w.back() += costs.back();
  std::vector<double> prefix = {0};
  for (const double c : w) prefix.push_back(prefix.back() + c);
  // best[k][j]: the smallest largest cost of blocks [0, j) in k stages; from[k][j]: where the
  // last of those stages begins.
  const auto n = static_cast<std::size_t>(depth);
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(static_cast<std::size_t>(stages) + 1,
                                        std::vector<double>(n + 1, inf));
  std::vector<std::vector<std::size_t>> from(best.size(), std::vector<std::size_t>(n + 1, 0));
  best[0][0] = 0;
  for (std::size_t k = 1; k < best.size(); ++k) {
    for (std::size_t j = k; j <= n; ++j) {
      for (std::size_t i = k - 1; i < j; ++i) {
        const double cost = std::max(best[k - 1][i], prefix[j] - prefix[i]);
        if (cost < best[k][j]) {
          best[k][j] = cost;
          from[k][j] = i;
        }
      }
    }
  }
  std::vector<int> splits(static_cast<std::size_t>(stages) - 1);
  std::size_t end = n;
  for (std::size_t k = best.size() - 1; k > 1; --k) {
    end = from[k][end];
    splits[k - 2] = static_cast<int>(end);
  }
  return splits;
}

}  // namespace flowtrain::train
