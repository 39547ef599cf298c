#include "stages/train/compute.hpp"

#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <omp.h>

namespace flowtrain::train {

IntraOpThreads::IntraOpThreads(int threads) {
  // ATen initialises a thread's count lazily on first use, overwriting what was set before;
  // trigger that first. Then set OpenMP's per-thread count directly: at::set_num_threads would
  // also reset process-wide state (oneDNN's cache) that another stage may be using.
  at::get_num_threads();
  previous_ = omp_get_max_threads();
  if (threads != previous_) omp_set_num_threads(threads);
}

IntraOpThreads::~IntraOpThreads() {
  if (omp_get_max_threads() != previous_) omp_set_num_threads(previous_);
}

Autocast::Autocast(bool enabled) : enabled_(enabled) {
  if (!enabled_) return;
  previous_ = at::autocast::is_cpu_enabled();
  at::autocast::set_cpu_enabled(true);
}

Autocast::~Autocast() {
  if (!enabled_) return;
  at::autocast::set_cpu_enabled(previous_);
  if (!previous_) at::autocast::clear_cache();
}

NoAutocast::NoAutocast() : previous_(at::autocast::is_cpu_enabled()) {
  at::autocast::set_cpu_enabled(false);
}

NoAutocast::~NoAutocast() { at::autocast::set_cpu_enabled(previous_); }

}  // namespace flowtrain::train
