#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "distributed/job.hpp"
#include "graph/options.hpp"
#include "graph/stage.hpp"
#include "stages/data/sample.hpp"

namespace flowtrain::data {

/// What a sample that cannot be read or decoded does (param on_bad_sample).
enum class OnBadSample { kAuto, kSkip, kReplace, kFail };
inline std::span<const EnumName<OnBadSample>> enum_names(OnBadSample) {
  static constexpr EnumName<OnBadSample> names[] = {{OnBadSample::kAuto, "auto"},
                                                    {OnBadSample::kSkip, "skip"},
                                                    {OnBadSample::kReplace, "replace"},
                                                    {OnBadSample::kFail, "fail"}};
  return names;
}

/// The `on_bad_sample` and `max_bad_fraction` params of the stages that decode (BadSamplePolicy).
struct BadSampleOptions {
  OnBadSample on_bad_sample = OnBadSample::kAuto;
  double max_bad_fraction = 0.05;
  template <class Declare>
  void declare(Declare& d) {
    d(on_bad_sample, "on_bad_sample",
      "a sample that cannot be read or decoded: 'skip' drops and reports it; 'replace' decodes a "
      "stand-in drawn from (seed, epoch, index), keeping the sample count; 'fail' stops the run; "
      "'auto': replace with several ranks (they must take equal steps), else skip");
    d(max_bad_fraction, "max_bad_fraction",
      "stop the run once more than this share of the samples so far were bad (judged in "
      "sequence order, from the 20th sample on, so every run of the same data decides alike)",
      {.min = 0});
  }
};

/// What a decoding stage does with a sample it cannot read or decode: its `on_bad_sample` and
/// `max_bad_fraction` params.
/// - `skip`: the sample is dropped with "path: reason" and listed in the report.
/// - `replace`: a stand-in takes its place, drawn from its source by (seed, epoch, index), so
///   the run keeps its sample count: what data parallelism needs (ranks must take the same number
///   of steps). The swap is counted and printed with both paths.
/// - `fail`: the run stops at the first bad sample.
/// - `auto` (the default): `replace` when the process is one of several ranks, else `skip`.
/// `skip` under data parallelism stops the run at the first bad sample, naming the rank and the
/// sample, rather than leave the other ranks waiting for a step that never comes.
///
/// Bad samples (skipped or replaced) also stop the run when more than `max_bad_fraction` of the
/// samples so far were bad (judged once at least 20 were seen). The share is judged in sequence
/// order, whatever order the workers finish in: after sample k (by ItemContext::seq) it is
/// bad(0..k) / (k + 1), so a run stops or not, with the same message, on every run of the same
/// data. Samples that never arrive (dropped upstream) are passed over once kLookahead later ones
/// have. Thread-safe.
///
///   if (!policy_.decode(sample, ctx, [&](Sample& s) { return decode_it(s); })) return std::nullopt;
class BadSamplePolicy {
 public:
  /// Throws Error for a `max_bad_fraction` outside [0, 1]. `job`: where the run stands in its
  /// job (with several ranks `auto` replaces, and the report names the rank).
  BadSamplePolicy(const BadSampleOptions& options, const JobPlacement& job);

  /// Decodes `sample` with `attempt` (it returns why it failed, or an empty string). Returns
  /// true with `sample` decoded (under `replace` maybe a stand-in), or false after dropping it
  /// through `ctx`; throws Error when the policy or the share of bad samples says to stop.
  template <class Decode>
  bool decode(Sample& sample, ItemContext& ctx, Decode&& attempt) {
    std::string error = attempt(sample);
    if (error.empty()) {
      judge(ctx.seq(), std::nullopt);
      return true;
    }
    std::string what = describe(sample, error);
    if (mode_ != Mode::kReplace) {
      reject(what);  // throws unless skipping
      judge(ctx.seq(), what);
      ctx.drop(std::move(what));
      return false;
    }
    const Sample bad = std::move(sample);
    for (std::uint32_t tries = 0;; ++tries) {
      sample = stand_in(bad, what, tries);
      if ((error = attempt(sample)).empty()) break;
    }
    replaced(what, sample);
    judge(ctx.seq(), std::move(what));
    return true;
  }

  /// Samples judged so far in sequence order, how many of them were bad, and how many stand-ins
  /// were used.
  std::uint64_t seen() const;
  std::uint64_t bad() const;
  std::uint64_t replacements() const;
  /// For the stage's results(): "replaced" when stand-ins were used.
  std::vector<StageResult> results() const;

  static constexpr std::uint64_t kMinSeenForFraction = 20;
  static constexpr std::size_t kLookahead = 4096;
  static constexpr std::uint32_t kMaxStandIns = 16;  // tries before a replace gives up

 private:
  enum class Mode { kSkip, kReplace, kFail };

  static std::string describe(const Sample& sample, const std::string& error);
  // Throws for `fail`, and for `skip` under data parallelism.
  void reject(const std::string& what) const;
  // Stand-in number `tries` for the bad sample (`what`); throws after kMaxStandIns tries, or
  // without an origin to ask.
  Sample stand_in(const Sample& bad, const std::string& what, std::uint32_t tries) const;
  void replaced(const std::string& what, const Sample& stand_in);
  // Records sample `seq` (with its "path: reason" if bad), then judges every sample now next in
  // sequence order. Throws Error when the share is above the limit.
  void judge(std::uint64_t seq, std::optional<std::string> bad);

  Mode mode_;
  int rank_ = 0;
  int world_size_ = 1;
  double max_bad_fraction_;
  mutable std::mutex mutex_;
  std::uint64_t next_ = 0;  // the sequence number judged next
  std::map<std::uint64_t, std::optional<std::string>> ahead_;  // arrived before their turn
  std::uint64_t seen_ = 0, bad_ = 0;  // judged so far
  std::uint64_t replacements_ = 0;
  std::string last_bad_;              // the latest bad one judged
};

}  // namespace flowtrain::data
