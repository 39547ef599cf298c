#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "graph/params.hpp"
#include "graph/stage.hpp"

namespace flowtrain::data {

/// What a decoding stage does with a sample it cannot read or decode: its `on_bad_sample` and
/// `max_bad_fraction` params. A bad sample is dropped with "path: reason", or fails the run when
/// `on_bad_sample` is "fail" or when more than `max_bad_fraction` of the samples seen so far (at
/// least 20) were bad. Thread-safe; the hot path (a good sample) is one atomic increment.
///
///   if (!error.empty()) return policy_.reject(sample.path, std::move(error), ctx);
///   policy_.accept();
class BadSamplePolicy {
 public:
  explicit BadSamplePolicy(const Params& params);
  /// The two params, for the describe() of a stage that uses the policy.
  static std::vector<ParamSpec> param_specs();

  /// Counts a good sample; throws Error if the share of bad ones is now above the limit.
  void accept();
  /// Counts a bad sample, then drops it (through `ctx`) or throws Error as the policy says.
  std::nullopt_t reject(const std::string& path, std::string reason, ItemContext& ctx);

  /// Samples judged so far, and how many of them were bad.
  std::uint64_t seen() const { return seen_.load(std::memory_order_relaxed); }
  std::uint64_t bad() const { return bad_.load(std::memory_order_relaxed); }

 private:
  void check_fraction();

  static constexpr std::uint64_t kMinSeenForFraction = 20;

  bool fail_on_bad_;
  double max_bad_fraction_;
  std::atomic<std::uint64_t> seen_{0};
  std::atomic<std::uint64_t> bad_{0};
  std::mutex last_bad_mutex_;  // bad samples are rare: a lock there costs the hot path nothing
  std::string last_bad_;
};

}  // namespace flowtrain::data
