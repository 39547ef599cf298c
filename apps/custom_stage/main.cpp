// custom_stage: assembling a pipeline in C++ with stages of your own, in two branches.
//
//              +--> [queue 16] --> is_prime (2 workers) -----+
//   numbers ---+                                             +--> both --> [queue 16] --> tally
//   (built-in  +--> [queue 16] --> is_palindrome (1 worker) -+  (JoinFacts)
//    sequence)     a Map class and a lambda: n -> Facts
//
// tally (CountPrimes) takes the items in sequence order, counts the primes and keeps the last.
//
// Run: build/apps/custom_stage/custom_stage [count]
// The same stages, registered in prime_stages.cpp, also make a plugin, libprime_stages.so, that
// runs the same graph from YAML with the flowtrain CLI (README.md):
//   build/apps/flowtrain/flowtrain run apps/custom_stage/primes.yaml
// The stages are added, then connected: `connect(a, b)` draws an edge and does not compile if
// b takes another item type than a gives. The source is a built-in stage with its typed
// options; a lambda is a stage too (here is_palindrome).
// Each number goes to both branches (fan-out); `both` gets the two Facts of one number together
// (a join pairs items by sequence number). The tally sees items in sequence order (a
// SerialSink) whatever the branches' concurrency, so "the largest" is the largest prime below
// count on every run.
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <memory>

#include "apps/custom_stage/prime_stages.hpp"
#include "graph/error.hpp"
#include "graph/pipeline.hpp"
#include "stages/util/sequence.hpp"

int main(int argc, char** argv) {
  using namespace custom_stage;
  try {
    const std::int64_t count = argc > 1 ? std::atoll(argv[1]) : 200000;

    flowtrain::Pipeline pipeline;
    auto numbers = pipeline.add<flowtrain::stages::SequenceSource>("numbers", {.count = count});
    auto is_prime =
        pipeline.add<IsPrimeStage>("is_prime", {}, {.concurrency = 2, .queue_capacity = 16});
    auto is_palindrome = pipeline.add("is_palindrome",
                                      [](std::uint64_t n) {
                                        return Facts{n, false, custom_stage::is_palindrome(n)};
                                      },
                                      {.queue_capacity = 16});
    auto both = pipeline.add<JoinFactsStage>("both");
    // The pipeline owns its stages; this one's counts are read after the run.
    auto counter = std::make_unique<CountPrimesStage>();
    const CountPrimesStage& counts = *counter;
    auto tally = pipeline.add("tally", std::move(counter), {.queue_capacity = 16});
    pipeline.connect(numbers, is_prime)
        .connect(numbers, is_palindrome)
        .connect(is_prime, both)
        .connect(is_palindrome, both)
        .connect(both, tally);
    std::cout << flowtrain::graph_text(pipeline.decls()) << "\n";
    const flowtrain::RunReport report = pipeline.run({.threads = 2});

    std::cout << counts.primes() << " primes below " << count << ", the largest "
              << counts.largest() << "; " << counts.palindromes() << " of them palindromes\n\n"
              << flowtrain::format_report(report);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "custom_stage: error: " << e.what() << "\n";
    return 1;
  }
}
