// custom_stage: assembling a pipeline in C++ with stages of your own.
//
//   numbers ---> [queue 16] ---> is_prime (2 workers) ---> [queue 16, in order] ---> tally
//   (built-in         user-defined Map:                     user-defined Sink:
//    sequence)        n -> (n, prime?)                      counts primes, keeps the last
//
// Run: build/apps/custom_stage/custom_stage [count]
// The tally sees items in sequence order (ordered = true) whatever is_prime's concurrency, so
// "last prime seen" is the largest prime below count on every run.
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <utility>

#include "graph/error.hpp"
#include "graph/pipeline.hpp"
#include "stages/util/sequence.hpp"

namespace {

using Verdict = std::pair<std::uint64_t, bool>;

class IsPrime final : public flowtrain::Map<std::uint64_t, Verdict> {
 protected:
  std::optional<Verdict> process(std::uint64_t&& n, flowtrain::ItemContext&) override {
    if (n < 2) return Verdict{n, false};
    for (std::uint64_t d = 2; d * d <= n; ++d) {
      if (n % d == 0) return Verdict{n, false};
    }
    return Verdict{n, true};
  }
};

class Tally final : public flowtrain::Sink<Verdict> {
 public:
  std::uint64_t primes = 0;
  std::uint64_t last = 0;

 protected:
  void consume(Verdict&& v, flowtrain::ItemContext&) override {
    if (!v.second) return;
    ++primes;  // serial sink: no lock needed
    last = v.first;
  }
};

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::int64_t count = argc > 1 ? std::atoll(argv[1]) : 200000;
    flowtrain::Params numbers =
        flowtrain::Params::defaults(flowtrain::stages::SequenceSource::describe().params);
    numbers.set("count", count);

    auto tally = std::make_unique<Tally>();
    Tally& result = *tally;
    flowtrain::Pipeline pipeline;
    pipeline.add("numbers", std::make_unique<flowtrain::stages::SequenceSource>(numbers))
        .add("is_prime", std::make_unique<IsPrime>(), {.concurrency = 2, .queue_capacity = 16})
        .add("tally", std::move(tally), {.queue_capacity = 16, .ordered = true});
    const flowtrain::RunReport report = pipeline.run({.threads = 2});

    std::cout << result.primes << " primes below " << count << ", the largest " << result.last
              << "\n\n"
              << flowtrain::format_report(report);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "custom_stage: error: " << e.what() << "\n";
    return 1;
  }
}
