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
                      "stop the run once more than this share of the samples seen (at least "
                      "20) were bad",
                      0)};
}

void BadSamplePolicy::accept() {
  seen_.fetch_add(1);
  check_fraction();
}

std::nullopt_t BadSamplePolicy::reject(const std::string& path,
                                       std::string reason,
                                       ItemContext& ctx) {
  seen_.fetch_add(1);
  std::string what = (path.empty() ? std::string("(no path)") : path) + ": " + reason;
  if (fail_on_bad_) {
    bad_.fetch_add(1);
    throw Error(what);
  }
  {
    std::lock_guard lock(last_bad_mutex_);
    last_bad_ = what;
  }
  bad_.fetch_add(1);
  check_fraction();
  return ctx.drop(std::move(what));
}

void BadSamplePolicy::check_fraction() {
  // bad_ first: every sample is counted in seen_ before bad_, so the pair never has bad > seen.
  const std::uint64_t bad = bad_.load();
  const std::uint64_t seen = seen_.load();
  if (seen < kMinSeenForFraction ||
      static_cast<double>(bad) <= max_bad_fraction_ * static_cast<double>(seen)) {
    return;
  }
  char text[160];
  std::snprintf(text, sizeof text,
                "%llu of %llu samples were bad (%.1f%%), above max_bad_fraction %g; last: ",
                static_cast<unsigned long long>(bad), static_cast<unsigned long long>(seen),
                100.0 * static_cast<double>(bad) / static_cast<double>(seen), max_bad_fraction_);
  std::lock_guard lock(last_bad_mutex_);
  throw Error(text + last_bad_);
}

}  // namespace flowtrain::data
