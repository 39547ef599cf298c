#include "stages/train/partitioned/batch_runner.hpp"

#include <torch/autograd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <limits>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include <oneapi/tbb/task.h>

#include "graph/error.hpp"
#include "stages/train/models/compute.hpp"
#include "stages/train/partitioned/thread_memory.hpp"

namespace flowtrain::train {

namespace {

using Kind = PartitionAction::Kind;
using Clock = std::chrono::steady_clock;

// Thrown in a rank waiting for a tensor once another rank failed: it stops without a message.
struct Cancelled {};

// Waiting for a condition guarded by a mutex: a thread blocks on a condition variable; a oneTBB
// task suspends, and its thread runs other tasks until notify_all resumes it.
class Waiters {
 public:
  explicit Waiters(bool suspend) : suspend_(suspend) {}

  // Returns once `ready()` holds; `lock` holds the mutex guarding it.
  template <class Ready>
  void wait(std::unique_lock<std::mutex>& lock, Ready ready) {
    if (!suspend_) {
      changed_.wait(lock, ready);
      return;
    }
    while (!ready()) {
      std::mutex& mutex = *lock.mutex();
      lock.unlock();
      tbb::task::suspend([&](tbb::task::suspend_point point) {
        std::unique_lock relock(mutex);
        if (ready()) {  // changed before the task was parked: go on at once
          relock.unlock();
          tbb::task::resume(point);
          return;
        }
        suspended_.push_back(point);
      });
      lock.lock();
    }
  }

  // Under the mutex, after a change that may make a waiter's condition hold.
  void notify_all() {
    changed_.notify_all();
    for (const tbb::task::suspend_point point : suspended_) tbb::task::resume(point);
    suspended_.clear();
  }

 private:
  bool suspend_;
  std::condition_variable changed_;
  std::vector<tbb::task::suspend_point> suspended_;
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

struct PartitionedBatch::State {
  // What a stage keeps of a micro-batch from its forward to its backward (only the rank
  // holding the stage touches its entries).
  struct Kept {
    torch::Tensor input;   // a stage's input, as a leaf whose gradient goes back
    torch::Tensor output;  // with its autograd graph; the last stage's: the scaled loss
  };

  const PartitionSchedule& schedule;
  const std::vector<ModelStageFn>& stages;
  std::function<torch::Tensor(int)> input;
  int intraop_threads;
  std::vector<double> weights;
  PartitionTransport* transport;
  int m, last, local_ranks = 0;
  std::vector<Kept> kept;
  std::vector<int> in_flight;
  PartitionedBatchResult result;
  Clock::time_point begin;

  // Between the ranks of this process, under `mutex`: stage s's forward output goes to stage
  // s + 1 under (kForward, s + 1, m), the gradient of its input back to stage s - 1 under
  // (kBackward, s - 1, m), each put once and taken once.
  std::mutex mutex;
  Waiters waiters;
  std::map<std::tuple<Kind, int, int>, torch::Tensor> mail;
  bool failed = false;
  std::string error;  // the first failure
  int finished = 0;   // ranks of this process done
  std::vector<double> waited_s;  // [rank]: for tensors of the others, in seconds

  State(const PartitionSchedule& schedule_of,
        const std::vector<ModelStageFn>& stages_of,
        std::function<torch::Tensor(int)> input_of,
        int threads,
        std::vector<double> weights_of,
        PartitionTransport* transport_of,
        bool suspend)
      : schedule(schedule_of),
        stages(stages_of),
        input(std::move(input_of)),
        intraop_threads(threads),
        weights(std::move(weights_of)),
        transport(transport_of),
        m(schedule_of.microbatches),
        last(schedule_of.stages - 1),
        waiters(suspend) {}

  double seconds() const { return std::chrono::duration<double>(Clock::now() - begin).count(); }
  bool local(int rank) const { return !transport || rank == transport->rank(); }
  double weight(int microbatch) const {
    return weights.empty() ? 1.0 / m : weights[static_cast<std::size_t>(microbatch)];
  }
  int tag(Kind kind, int stage, int microbatch) const {
    return ((kind == Kind::kForward ? 0 : schedule.stages) + stage) * m + microbatch;
  }
  static std::string what(Kind kind, int stage, int microbatch) {
    const std::string s = std::to_string(stage);
    return (kind == Kind::kForward ? "stage " + s + "'s input"
                                   : "the gradient of stage " + s + "'s output") +
           " of micro-batch " + std::to_string(microbatch);
  }

  // To the rank holding `stage`: in memory, or through the transport to another process.
  void put(Kind kind, int stage, int microbatch, torch::Tensor tensor) {
    const int to = schedule.rank_of(stage);
    if (!local(to)) {
      transport->send(to, tag(kind, stage, microbatch), tensor.contiguous(),
                      what(kind, stage, microbatch));
      return;
    }
    std::lock_guard lock(mutex);
    mail[{kind, stage, microbatch}] = std::move(tensor);
    waiters.notify_all();
  }

  torch::Tensor take(Kind kind, int stage, int microbatch) {
    const int from = schedule.rank_of(kind == Kind::kForward ? stage - 1 : stage + 1);
    if (!local(from)) {
      // Received into memory this rank keeps (an activation until its backward): counted to
      // it, as what it computes is. A receive blocks its thread, so no other task runs in
      // this scope.
      CountThreadMemory count(schedule.rank_of(stage) % CountThreadMemory::kSlots);
      return transport->recv(from, tag(kind, stage, microbatch), what(kind, stage, microbatch));
    }
    const std::tuple key{kind, stage, microbatch};
    std::unique_lock lock(mutex);
    const Clock::time_point asked = Clock::now();
    waiters.wait(lock, [&] { return failed || mail.count(key) != 0; });
    waited_s[static_cast<std::size_t>(schedule.rank_of(stage))] +=
        std::chrono::duration<double>(Clock::now() - asked).count();
    if (failed) throw Cancelled{};
    torch::Tensor out = std::move(mail[key]);
    mail.erase(key);
    return out;
  }

  void fail(const std::string& reason) {
    std::lock_guard lock(mutex);
    if (error.empty()) error = reason;
    failed = true;
    waiters.notify_all();
  }

  void rank_done() {
    std::lock_guard lock(mutex);
    ++finished;
    waiters.notify_all();
  }
};

PartitionedBatch::PartitionedBatch(const PartitionSchedule& schedule,
                             const std::vector<ModelStageFn>& stages,
                             std::function<torch::Tensor(int)> input,
                             int intraop_threads,
                             std::vector<double> weights,
                             PartitionTransport* transport,
                             Wait wait) {
  if (stages.size() != static_cast<std::size_t>(schedule.stages)) {
    throw Error("the pipeline schedule has " + std::to_string(schedule.stages) +
                " stages, but the model was split into " + std::to_string(stages.size()));
  }
  const int m = schedule.microbatches;
  if (!weights.empty() && weights.size() != static_cast<std::size_t>(m)) {
    throw Error("run_partitioned_batch: " + std::to_string(weights.size()) + " loss weights for " +
                std::to_string(m) + " micro-batches");
  }
  const int ranks = static_cast<int>(schedule.actions.size());
  if (transport && (transport->rank() < 0 || transport->rank() >= ranks)) {
    throw Error("run_partitioned_batch: this process runs pipeline rank " +
                std::to_string(transport->rank()) + ", but the schedule has " +
                std::to_string(ranks) + " ranks");
  }
  state_ = std::make_unique<State>(schedule, stages, std::move(input), intraop_threads,
                                   std::move(weights), transport, wait == Wait::kSuspend);
  State& s = *state_;
  for (int r = 0; r < ranks; ++r) s.local_ranks += s.local(r) ? 1 : 0;
  s.kept.resize(static_cast<std::size_t>(schedule.stages * m));
  s.result.losses.assign(static_cast<std::size_t>(m), 0.0);
  s.result.spans.resize(schedule.actions.size());
  s.result.peak_in_flight.assign(static_cast<std::size_t>(schedule.stages), 0);
  s.result.peak_bytes.assign(schedule.actions.size(), 0);
  s.in_flight.assign(static_cast<std::size_t>(schedule.stages), 0);
  s.waited_s.assign(schedule.actions.size(), 0.0);
  install_memory_counting();  // before the ranks allocate
  s.begin = s.result.start = Clock::now();
}

PartitionedBatch::~PartitionedBatch() = default;

void PartitionedBatch::run_rank(int rank) {
  State& s = *state_;
  const auto r = static_cast<std::size_t>(rank);
  // Each action counts its allocations into the rank's slot. A rank may change threads
  // between actions (a task resumed elsewhere), so the thread's settings are made per action.
  const int slot = rank % CountThreadMemory::kSlots;
  thread_memory_reset_peak(slot);
  const std::int64_t held_before = thread_memory_live(slot);
  for (const PartitionAction& a : s.schedule.actions[r]) {
    const auto stage = static_cast<std::size_t>(a.stage);
    State::Kept& k = s.kept[stage * static_cast<std::size_t>(s.m) +
                            static_cast<std::size_t>(a.microbatch)];
    const bool forward = a.kind == Kind::kForward;
    double start = 0;  // once its input is there: waiting for it is the bubble
    try {
      // The one point where a rank waits: the previous stage's activation (a forward) or the
      // next stage's gradient (a backward), unless its own stage is the first or the last.
      const bool takes = forward ? a.stage > 0 : a.stage < s.last;
      const torch::Tensor in = takes ? s.take(a.kind, a.stage, a.microbatch) : torch::Tensor();
      start = s.seconds();
      IntraOpThreads threads(s.intraop_threads);
      CountThreadMemory count(slot);
      if (forward) {
        if (takes) k.input = in.requires_grad_();
        torch::Tensor y = s.stages[stage](takes ? k.input : s.input(a.microbatch), a.microbatch);
        if (a.stage == s.last) {
          s.result.losses[static_cast<std::size_t>(a.microbatch)] = y.item<double>();
          k.output = y * s.weight(a.microbatch);
        } else {
          s.put(Kind::kForward, a.stage + 1, a.microbatch, y.detach());
          k.output = std::move(y);
        }
        s.result.peak_in_flight[stage] =
            std::max(s.result.peak_in_flight[stage], ++s.in_flight[stage]);
      } else {
        if (takes) {
          torch::autograd::backward({k.output}, {in});
        } else {
          torch::autograd::backward({k.output});
        }
        if (a.stage > 0) s.put(Kind::kBackward, a.stage - 1, a.microbatch, k.input.grad());
        k = {};  // the activations go as soon as the backward is done
        --s.in_flight[stage];
      }
    } catch (const Cancelled&) {
      s.rank_done();
      return;
    } catch (...) {
      const std::string error = "pipeline rank " + std::to_string(rank) + ", " +
                                (forward ? "forward" : "backward") +
                                " of stage " + std::to_string(a.stage) + ", micro-batch " +
                                std::to_string(a.microbatch) + ": " + current_exception_text();
      s.fail(error);
      s.rank_done();
      throw Error(error);
    }
    s.result.spans[r].emplace_back(start, s.seconds());
  }
  s.result.peak_bytes[r] = thread_memory_peak(slot) - held_before;
  s.rank_done();
}

void PartitionedBatch::run() {
  std::vector<std::thread> threads;
  for (int r = 0; r < static_cast<int>(state_->schedule.actions.size()); ++r) {
    if (!state_->local(r)) continue;
    threads.emplace_back([this, r] {
      try {
        run_rank(r);
      } catch (const Error&) {
        // kept for finish()
      }
    });
  }
  for (std::thread& t : threads) t.join();
}

void PartitionedBatch::wait_ranks() {
  State& s = *state_;
  std::unique_lock lock(s.mutex);
  s.waiters.wait(lock, [&] { return s.finished == s.local_ranks; });
}

void PartitionedBatch::cancel(const std::string& reason) { state_->fail(reason); }

double PartitionedBatch::waited_seconds(int rank) const {
  std::lock_guard lock(state_->mutex);
  return state_->waited_s.at(static_cast<std::size_t>(rank));
}

PartitionedBatchResult PartitionedBatch::finish() {
  State& s = *state_;
  if (!s.error.empty()) throw Error(s.error);
  if (s.transport) s.transport->flush();
  PartitionedBatchResult& result = s.result;
  result.wall_s = s.seconds();
  double busy = 0, sum = 0;
  for (const auto& spans : result.spans) {
    for (const auto& [start, end] : spans) busy += end - start;
  }
  for (int i = 0; i < s.m; ++i) sum += s.weight(i) * result.losses[static_cast<std::size_t>(i)];
  result.loss = sum;
  result.bubble =
      result.wall_s > 0 ? 1 - busy / (static_cast<double>(s.local_ranks) * result.wall_s) : 0;
  return std::move(result);
}

PartitionedBatchResult run_partitioned_batch(const PartitionSchedule& schedule,
                                       const std::vector<ModelStageFn>& stages,
                                       const std::function<torch::Tensor(int)>& input,
                                       int intraop_threads,
                                       const std::vector<double>& weights,
                                       PartitionTransport* transport) {
  PartitionedBatch batch(schedule, stages, input, intraop_threads, weights, transport);
  batch.run();
  return batch.finish();
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

std::vector<ModelStageFn> vit_model_stages(
    ViT& model,
    const std::vector<int>& splits,
    std::function<torch::Tensor(const ModelOutput&, int)> loss) {
  const std::vector<int> bounds = chunk_bounds(model->blocks(), splits);
  std::vector<ModelStageFn> out;
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
