#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <string>

#include "distributed/device.hpp"
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

/// Enables autocast to `dtype` (bfloat16 or float16) for `device`'s kind on the calling thread
/// while in scope; float32 leaves it off.
///
///   Autocast autocast(autocast_dtype(options.autocast, device), device.type());
class Autocast {
 public:
  explicit Autocast(c10::ScalarType dtype, c10::DeviceType device = c10::DeviceType::CPU);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  bool enabled_;
  c10::DeviceType device_;
  bool previous_ = false;
  c10::ScalarType previous_dtype_ = c10::kFloat;
};

/// Disables autocast for `device`'s kind on the calling thread while in scope: the loss of a
/// forward that ran under Autocast, computed in float32 as outside it.
class NoAutocast {
 public:
  explicit NoAutocast(c10::DeviceType device = c10::DeviceType::CPU);
  ~NoAutocast();
  NoAutocast(const NoAutocast&) = delete;
  NoAutocast& operator=(const NoAutocast&) = delete;

 private:
  c10::DeviceType device_;
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
  d(autocast, "autocast",
    "mixed precision of the forward pass: none, bf16, fp16 (on a GPU; training then scales "
    "the loss, as torch.cuda.amp.GradScaler), or auto: bf16 where this machine's CPU has "
    "bfloat16 dot-product instructions (avx512_bf16 or amx_bf16), none where it has not (there "
    "bf16 products run many times slower than float32)",
    {.choices = {"none", "bf16", "fp16", "auto"}});
}
template <class Declare>
void declare_device(Declare& d, std::string& device) {
  d(device, "device", dist::kDeviceDoc);
}
/// Whether this machine's CPU has bfloat16 dot-product instructions (AVX512-BF16 or AMX-BF16;
/// cpuid, as `lscpu` lists them as avx512_bf16 and amx_bf16), with which oneDNN runs bf16
/// products faster than float32 ones; without them LibTorch 1.13's are scalar loops.
bool cpu_has_bf16();
/// An `autocast` option's word with `auto` decided (bf16 if cpu_has_bf16(), else none): the
/// same on every run on one machine, so a run's results stay reproducible there.
std::string resolve_autocast(const std::string& autocast);
/// True if an `autocast` option asks for bfloat16 (`auto` decided).
inline bool wants_bf16(const std::string& autocast) {
  return resolve_autocast(autocast) == "bf16";
}
/// The dtype an `autocast` option asks for on `device` (float32 for none; `auto` decided by
/// resolve_autocast). Throws Error for fp16 off a GPU (check_autocast).
c10::ScalarType autocast_dtype(const std::string& autocast, const c10::Device& device);
/// Throws Error for float16 autocast off a GPU: the CPU's autocast has no float16, and its loss
/// would need no scaling.
void check_autocast(c10::ScalarType dtype, const c10::Device& device);

/// This CPU's rate for a matrix product of 1024 x 1024 by 1024 x 1024 in `dtype` (float32, or
/// bfloat16 as autocast runs it) on `threads` intra-op threads, in GFLOP/s: the ceiling a
/// model's matrix products approach. Measured the first time a (dtype, threads) is asked for in
/// the process (the median of up to 7 products after 2, 0.1-0.3 s; ~1 s where a product is
/// slow), best while nothing else runs; then the same.
double matrix_rate_gflops(c10::ScalarType dtype, int threads);

}  // namespace flowtrain::train
