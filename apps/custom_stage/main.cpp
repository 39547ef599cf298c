// custom_stage: assembling a pipeline in C++ with stages of your own, in two branches.
//
//              +--> [queue 16] --> is_prime (2 workers) -----+
//   numbers ---+                                             +--> both --> [queue 16, in order] --> tally
//   (built-in  +--> [queue 16] --> is_palindrome (1 worker) -+    (Join)     (a lambda sink: counts,
//    sequence)     a Map class and a lambda: n -> Facts                       keeps the last prime)
//
// Run: build/apps/custom_stage/custom_stage [count]
// The stages are added, then connected: `connect(a, b)` draws an edge and does not compile if
// b takes another item type than a gives. The source is a built-in stage with its typed
// options; a lambda is a stage too (here a map and a sink).
// Each number goes to both branches (fan-out); `both` gets the two Facts of one number together
// (a join pairs items by sequence number). The tally sees items in sequence order
// (ordered = true) whatever the branches' concurrency, so "the largest" is the largest prime
// below count on every run.
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <utility>
#include <vector>

#include "graph/error.hpp"
#include "graph/pipeline.hpp"
#include "stages/util/sequence.hpp"

namespace {

// What the branches find out about a number; each fills in its own field.
struct Facts {
  std::uint64_t n = 0;
  bool prime = false;
  bool palindrome = false;
};

class IsPrime final : public flowtrain::Map<std::uint64_t, Facts> {
 protected:
  std::optional<Facts> process(std::uint64_t&& n, flowtrain::ItemContext&) override {
    Facts facts{n, n >= 2};
    for (std::uint64_t d = 2; facts.prime && d * d <= n; ++d) facts.prime = n % d != 0;
    return facts;
  }
};

// Joins the two branches' facts about one number (parts in the order of its inputs).
class Both final : public flowtrain::Join<Facts, Facts> {
 protected:
  std::optional<Facts> process(std::vector<Facts>&& parts, flowtrain::ItemContext&) override {
    return Facts{parts[0].n, parts[0].prime, parts[1].palindrome};
  }
};

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::int64_t count = argc > 1 ? std::atoll(argv[1]) : 200000;
    std::uint64_t primes = 0;
    std::uint64_t palindromes = 0;
    std::uint64_t last = 0;

    flowtrain::Pipeline pipeline;
    auto numbers = pipeline.add<flowtrain::stages::SequenceSource>("numbers", {.count = count});
    auto is_prime = pipeline.add("is_prime", std::make_unique<IsPrime>(),
                                 {.concurrency = 2, .queue_capacity = 16});
    auto is_palindrome = pipeline.add(
        "is_palindrome",
        [](std::uint64_t n) {
          std::uint64_t reversed = 0;
          for (std::uint64_t rest = n; rest > 0; rest /= 10) reversed = reversed * 10 + rest % 10;
          return Facts{n, false, reversed == n};
        },
        {.queue_capacity = 16});
    auto both = pipeline.add("both", std::make_unique<Both>());
    // A serial sink: no lock needed. `ordered` hands it the numbers in sequence order.
    auto tally = pipeline.add(
        "tally",
        [&](Facts f) {
          if (!f.prime) return;
          ++primes;
          palindromes += f.palindrome ? 1 : 0;
          last = f.n;
        },
        {.queue_capacity = 16, .ordered = true});
    pipeline.connect(numbers, is_prime)
        .connect(numbers, is_palindrome)
        .connect(is_prime, both)
        .connect(is_palindrome, both)
        .connect(both, tally);
    std::cout << flowtrain::graph_text(pipeline.decls()) << "\n";
    const flowtrain::RunReport report = pipeline.run({.threads = 2});

    std::cout << primes << " primes below " << count << ", the largest " << last << "; "
              << palindromes << " of them palindromes\n\n"
              << flowtrain::format_report(report);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "custom_stage: error: " << e.what() << "\n";
    return 1;
  }
}
