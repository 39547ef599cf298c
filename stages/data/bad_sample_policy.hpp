#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "graph/params.hpp"
#include "graph/stage.hpp"

namespace flowtrain::data {

/// What a decoding stage does with a sample it cannot read or decode: its `on_bad_sample` and
/// `max_bad_fraction` params. A bad sample is dropped with "path: reason", or fails the run when
/// `on_bad_sample` is "fail", or when more than `max_bad_fraction` of the samples so far were bad
/// (judged once at least 20 were seen).
///
/// The share is judged in sequence order, whatever order the workers finish in: after sample k
/// (by ItemContext::seq) it is bad(0..k) / (k + 1), so a run stops or not, with the same message,
/// on every run of the same data. Samples that never arrive (dropped upstream) are passed over
/// once kLookahead later ones have. Thread-safe.
///
///   if (!error.empty()) return policy_.reject(sample.path, std::move(error), ctx);
///   policy_.accept(ctx);
class BadSamplePolicy {
 public:
  explicit BadSamplePolicy(const Params& params);
  /// The two params, for the describe() of a stage that uses the policy.
  static std::vector<ParamSpec> param_specs();

  /// Counts the good sample `ctx.seq()`; throws Error if the share of bad ones is now above the
  /// limit.
  void accept(const ItemContext& ctx);
  /// Counts a bad sample, then drops it (through `ctx`) or throws Error as the policy says.
  std::nullopt_t reject(const std::string& path, std::string reason, ItemContext& ctx);

  /// Samples judged so far in sequence order, and how many of them were bad.
  std::uint64_t seen() const;
  std::uint64_t bad() const;

  static constexpr std::uint64_t kMinSeenForFraction = 20;
  static constexpr std::size_t kLookahead = 4096;

 private:
  // Records sample `seq` (with its "path: reason" if bad), then judges every sample now next in
  // sequence order. Throws Error when the share is above the limit.
  void judge(std::uint64_t seq, std::optional<std::string> bad);

  bool fail_on_bad_;
  double max_bad_fraction_;
  mutable std::mutex mutex_;
  std::uint64_t next_ = 0;  // the sequence number judged next
  std::map<std::uint64_t, std::optional<std::string>> ahead_;  // arrived before their turn
  std::uint64_t seen_ = 0, bad_ = 0;  // judged so far
  std::string last_bad_;              // the latest bad one judged
};

}  // namespace flowtrain::data
