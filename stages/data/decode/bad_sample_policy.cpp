#include "stages/data/decode/bad_sample_policy.hpp"

#include <cstdio>
#include <iostream>

#include "graph/error.hpp"

namespace flowtrain::data {

BadSamplePolicy::BadSamplePolicy(const BadSampleOptions& options, const JobPlacement& job)
    : rank_(job.rank), world_size_(job.world_size), max_bad_fraction_(options.max_bad_fraction) {
  switch (options.on_bad_sample) {
    case OnBadSample::kSkip:
      mode_ = Mode::kSkip;
      break;
    case OnBadSample::kReplace:
      mode_ = Mode::kReplace;
      break;
    case OnBadSample::kFail:
      mode_ = Mode::kFail;
      break;
    case OnBadSample::kAuto:
      mode_ = world_size_ > 1 ? Mode::kReplace : Mode::kSkip;
      break;
  }
  if (!(max_bad_fraction_ >= 0 && max_bad_fraction_ <= 1)) {
    throw Error("max_bad_fraction must be between 0 and 1, not " +
                std::to_string(max_bad_fraction_));
  }
}

std::string BadSamplePolicy::describe(const Sample& sample, const std::string& error) {
  return (sample.path.empty() ? std::string("(no path)") : sample.path) + ": " + error;
}

void BadSamplePolicy::reject(const std::string& what) const {
  if (mode_ == Mode::kFail) throw Error(what);
  if (world_size_ > 1) {
    throw Error("rank " + std::to_string(rank_) + ": " + what +
                "; dropping it would leave this rank a step short of the others, which would "
                "wait for it until the collective timeout: use on_bad_sample: replace (or auto)");
  }
}

Sample BadSamplePolicy::stand_in(const Sample& bad,
                                 const std::string& what,
                                 std::uint32_t tries) const {
  if (!bad.origin) {
    throw Error(what + "; on_bad_sample: replace needs a dataset source to draw a stand-in from");
  }
  if (tries == kMaxStandIns) {
    throw Error(what + "; and the " + std::to_string(kMaxStandIns) +
                " stand-ins drawn for it were bad too");
  }
  return bad.origin->stand_in(bad, tries);
}

void BadSamplePolicy::replaced(const std::string& what, const Sample& stand_in) {
  {
    std::lock_guard lock(mutex_);
    ++replacements_;
  }
  std::cerr << ("flowtrain: replaced " + what + " with " + stand_in.path + "\n");
}

std::uint64_t BadSamplePolicy::replacements() const {
  std::lock_guard lock(mutex_);
  return replacements_;
}

std::vector<StageResult> BadSamplePolicy::results() const {
  const std::uint64_t n = replacements();
  if (n == 0) return {};
  return {{"replaced", static_cast<double>(n)}};
}

std::uint64_t BadSamplePolicy::seen() const {
  std::lock_guard lock(mutex_);
  return seen_;
}

std::uint64_t BadSamplePolicy::bad() const {
  std::lock_guard lock(mutex_);
  return bad_;
}

void BadSamplePolicy::judge(std::uint64_t seq, std::optional<std::string> bad) {
  std::lock_guard lock(mutex_);
  if (seq != next_ || !ahead_.empty()) {
    ahead_.emplace(seq, std::move(bad));
    // A sample missing this long was dropped before the stage: pass over it.
    if (ahead_.size() > kLookahead) next_ = ahead_.begin()->first;
    if (ahead_.begin()->first != next_) return;
    bad = std::move(ahead_.begin()->second);
    ahead_.erase(ahead_.begin());
  }
  for (;;) {
    ++next_;
    ++seen_;
    if (bad) {
      ++bad_;
      last_bad_ = std::move(*bad);
    }
    if (seen_ >= kMinSeenForFraction &&
        static_cast<double>(bad_) > max_bad_fraction_ * static_cast<double>(seen_)) {
      char text[160];
      std::snprintf(text, sizeof text,
                    "%llu of %llu samples were bad (%.1f%%), above max_bad_fraction %g; last: ",
                    static_cast<unsigned long long>(bad_), static_cast<unsigned long long>(seen_),
                    100.0 * static_cast<double>(bad_) / static_cast<double>(seen_),
                    max_bad_fraction_);
      throw Error(text + last_bad_);
    }
    if (ahead_.empty() || ahead_.begin()->first != next_) return;
    bad = std::move(ahead_.begin()->second);
    ahead_.erase(ahead_.begin());
  }
}

}  // namespace flowtrain::data
