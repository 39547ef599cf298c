#pragma once

#include <string>

#include "graph/params.hpp"

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
///   Autocast bf16(options.autocast == "bf16");
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

/// The parameters every compute stage declares: intraop_threads and autocast.
ParamSpec intraop_threads_param();
ParamSpec autocast_param();
/// True if the autocast param asks for bfloat16.
bool wants_bf16(const Params& params);

}  // namespace flowtrain::train
