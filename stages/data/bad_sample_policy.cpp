#include "stages/data/bad_sample_policy.hpp"

#include <cstdio>

#include "graph/error.hpp"

namespace flowtrain::data {

namespace {
bool parse_policy(const std::string& policy) {
  if (policy == "skip") return false;
  if (policy == "fail") return true;
  throw Error("on_bad_sample must be 'skip' or 'fail', not '" + policy + "'");
}
}  // namespace

BadSamplePolicy::BadSamplePolicy(const Params& params)
    : fail_on_bad_(parse_policy(params.get_string("on_bad_sample"))),
      max_bad_fraction_(params.get_float("max_bad_fraction")) {
  if (!(max_bad_fraction_ >= 0 && max_bad_fraction_ <= 1)) {
    throw Error("max_bad_fraction must be between 0 and 1, not " +
                std::to_string(max_bad_fraction_));
  }
}

std::vector<ParamSpec> BadSamplePolicy::param_specs() {
  return {string_param("on_bad_sample", "skip",
                       "a sample that cannot be read or decoded: 'skip' drops and reports it, "
                       "'fail' stops the run",
                       {"skip", "fail"}),
          float_param("max_bad_fraction", 0.05,
                      "stop the run once more than this share of the samples so far were bad "
                      "(judged in sequence order, from the 20th sample on, so every run of the "
                      "same data decides alike)",
                      0)};
}

void BadSamplePolicy::accept(const ItemContext& ctx) { judge(ctx.seq(), std::nullopt); }

std::nullopt_t BadSamplePolicy::reject(const std::string& path,
                                       std::string reason,
                                       ItemContext& ctx) {
  std::string what = (path.empty() ? std::string("(no path)") : path) + ": " + reason;
  if (fail_on_bad_) throw Error(what);
  judge(ctx.seq(), what);
  return ctx.drop(std::move(what));
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
