#pragma once

#include <string>

#include "graph/options.hpp"

namespace flowtrain::train {

/// Runs ATen's intra-op parallelism (OpenMP, and OpenBLAS built on it) on the calling thread
/// with `threads` threads until destroyed, then restores the previous count. OpenMP keeps the
/// count per thread, so two stages on two graph threads each get their own. ATen starts every
/// new thread at one intra-op thread on this machine; compute stages set theirs explicitly.
///
///   IntraOpThreads scope(2);
///   auto out = model->forward(images);  // matrix products on 2 threads
class IntraOpThreads {
 public:
  explicit IntraOpThreads(int threads);
  ~IntraOpThreads();
  IntraOpThreads(const IntraOpThreads&) = delete;
  IntraOpThreads& operator=(const IntraOpThreads&) = delete;

 private:
  int previous_;
};

/// Enables CPU autocast to bfloat16 on the calling thread while in scope (when `enabled`).
///
///   Autocast bf16(wants_bf16(options.autocast));
class Autocast {
 public:
  explicit Autocast(bool enabled);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  bool enabled_;
  bool previous_ = false;
};

/// Disables CPU autocast on the calling thread while in scope: the loss of a forward that ran
/// under Autocast, computed in float32 as outside it.
class NoAutocast {
 public:
  NoAutocast();
  ~NoAutocast();
  NoAutocast(const NoAutocast&) = delete;
  NoAutocast& operator=(const NoAutocast&) = delete;

 private:
  bool previous_;
};

/// The options every compute stage declares: plain fields of its options struct named as their
/// keys, `int intraop_threads = 1;` and `std::string autocast = "none";`, each declared by its
/// helper here, so the name, doc and bounds are written once:
///
///   template <class Declare>
///   void declare(Declare& d) {
///     declare_intraop_threads(d, intraop_threads);
///     declare_autocast(d, autocast);
///   }
template <class Declare>
void declare_intraop_threads(Declare& d, int& intraop_threads) {
  d(intraop_threads, "intraop_threads",
    "ATen/OpenMP threads of one invocation (counted in the run's cores); in a config, `auto`: "
    "the most that fit the cores granted",
    {.min = 1});
}
template <class Declare>
void declare_autocast(Declare& d, std::string& autocast) {
  d(autocast, "autocast", "mixed precision of the forward pass", {.choices = {"none", "bf16"}});
}
/// True if an `autocast` option asks for bfloat16.
inline bool wants_bf16(const std::string& autocast) { return autocast == "bf16"; }

}  // namespace flowtrain::train
