#pragma once

#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "distributed/job.hpp"
#include "distributed/torch_compat.hpp"
#include "graph/error.hpp"
#include "graph/stop_vote.hpp"

namespace flowtrain::dist {

/// How this process joins its data-parallel job.
struct WorldOptions {
  // What reduces GPU tensors: auto (NCCL where LibTorch has CUDA), gloo, nccl. CPU tensors
  // always go through Gloo.
  std::string backend = "auto";
  std::chrono::milliseconds timeout{300000};  // rendezvous and collectives
  std::string config_hash;                    // ranks must agree on it (checked at start)
};

/// How often each rank writes its heartbeat to the store, and how often a wait looks there for
/// a rank that failed or went away.
inline constexpr std::chrono::milliseconds kHeartbeatInterval{1000};

/// A failure of the job rather than of this rank's own work: another rank failed or stopped
/// responding, or a rendezvous or barrier timed out. The message already names the ranks, the
/// store's address and the reason, so there is nothing to add from diagnose().
class WorldError : public Error {
 public:
  using Error::Error;
};

/// The c10d process group of a data-parallel job: created once per process from the launcher's
/// environment (JobPlacement), rendezvous through a c10d TCPStore on MASTER_ADDR:MASTER_PORT
/// (hosted by rank 0). The runner (run_phases) hands it to the stages it builds through their
/// BuildContext; a single process has none:
///
///   EvaluateStage(const Options& options, const BuildContext& context)
///       : world_(context.find<dist::World>()) {}
///   ...
///   if (world_) world_->group().allreduce(sums)->wait();
///
/// Every rank writes a heartbeat to the store each second from a background thread; the waits
/// below and diagnose() use them to name a rank that was killed or hung instead of waiting out
/// the timeout.
class World {
 public:
  /// Joins the job described by `placement` (a no-op returning nullptr for a single process).
  /// Throws WorldError with one line: rendezvous timeout naming MASTER_ADDR:PORT and the ranks
  /// that did not arrive, a config hash that differs from rank 0's (naming both ranks); Error
  /// for a backend this LibTorch lacks.
  static World* init(const JobPlacement& placement, const WorldOptions& options);
  /// The world of this process, or nullptr when it runs alone: for the process's own concerns
  /// (its error prefix, leaving the job on a fatal error). Stages get it when built instead.
  static World* current();
  /// Leaves the job (waits for the other ranks first, so nobody sees a vanished peer; rank 0,
  /// which hosts the store, leaves last). Throws WorldError if a rank does not arrive; the
  /// world is then kept, for diagnose().
  static void shutdown();

  int rank() const;
  int size() const;
  const std::string& backend() const;  // for GPU tensors: "gloo" or "nccl"
  std::string address() const;         // "MASTER_ADDR:PORT" of the store
  /// The world's Gloo group: CPU tensors, and whatever every rank exchanges on the side.
  Group& group();
  /// The group that reduces tensors on `device`: group() for the CPU; for a GPU, with backend
  /// nccl (or auto, where LibTorch has CUDA), an NCCL group on this rank's GPU, made at the
  /// first call (every rank asks in the same order) and kept, else group().
  Group& group_for(const c10::Device& device);
  /// A process group of some of the world's ranks (sorted, this one among them), in which
  /// ranks[i] is rank i: c10d's new_group. Every member asks for it, the others never do;
  /// made at the first call and kept. Pipeline and data parallelism together use one per
  /// pipeline and one per partition's data-parallel replicas.
  Group& subgroup(const std::vector<int>& ranks);
  c10d::Store& store();
  std::chrono::milliseconds timeout() const;
  /// The ranks' agreement on when to stop after a signal (graph/stop_vote.hpp): the runner
  /// hands it to StopOnSignal, a data-parallel gradient sync holds it and exchanges the votes.
  StopVote& stop_vote();

  /// Waits until every rank has called barrier() (in the same order on every rank), through
  /// the store. `what` names it in errors: "barrier 'end of phase main' timed out after 300 s:
  /// 1 of 2 ranks arrived (missing: rank 1)", or sooner "rank 1 stopped responding 5 s ago".
  void barrier(const std::string& what);

  /// Waits for this rank's collective `work` (a gradient bucket's all-reduce, say) while
  /// watching the other ranks: instead of sitting out the timeout, throws WorldError within a
  /// few seconds when another rank failed, stopped responding, or already finished the phase
  /// this rank is still in (the ranks took different numbers of steps: items dropped on one rank
  /// only), naming that rank. `what` names the collective in the message. Rethrows the
  /// collective's own error. With NCCL it returns once the work is on the stream, as wait() does.
  ///
  ///   world->wait(*world->group().allreduce(sums), "the validation all-reduce");
  void wait(c10d::Work& work, std::string_view what);

  /// Tells the other ranks this one has finished its current phase; `summary` says how (its
  /// steps and drops). A rank still waiting in a collective of that phase then fails with it
  /// (see wait()). Call once per phase, after the phase's graph drained.
  void finished_phase(const std::string& summary);

  /// Every rank contributes `text`; rank 0 gets them all in rank order (waiting as barrier()
  /// does), the other ranks get an empty vector at once. For per-rank summaries.
  std::vector<std::string> gather_text(const std::string& what, const std::string& text);

  /// After a failed collective: one line naming the ranks that failed (see report_failure) or
  /// stopped responding (from their heartbeats in the store), e.g. "rank 1 stopped responding
  /// 12 s ago (killed or hung?)"; or that the store on rank 0 is unreachable. Takes ~2.5 s
  /// (it watches the heartbeats for two beats).
  std::string diagnose() const;

  /// Tells the other ranks why this one is about to exit (their waits and diagnose() then say
  /// "rank 1 failed: <message>"). Never throws.
  void report_failure(const std::string& message) noexcept;

  ~World();

 private:
  struct Impl;
  explicit World(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// A short fingerprint of a config (64-bit FNV-1a, 16 hex digits) for WorldOptions::config_hash.
std::string config_fingerprint(std::string_view text);

/// The fingerprint of what every rank of a job must agree on: a config file's text and the
/// command line's overrides.
std::string config_file_fingerprint(const std::string& path,
                                     const std::vector<std::string>& overrides);

}  // namespace flowtrain::dist
