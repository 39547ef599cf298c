// custom_stage: assembling a pipeline in C++ with stages of your own, in two branches.
//
//              +--> [queue 16] --> is_prime (2 workers) -----+
//   numbers ---+                                             +--> both --> [queue 16, in order] --> tally
//   (built-in  +--> [queue 16] --> is_palindrome (1 worker) -+    (Join)     (Sink: counts, keeps
//    sequence)     user-defined Maps: n -> Facts                              the last prime)
//
// Run: build/apps/custom_stage/custom_stage [count]
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

class IsPalindrome final : public flowtrain::Map<std::uint64_t, Facts> {
 protected:
  std::optional<Facts> process(std::uint64_t&& n, flowtrain::ItemContext&) override {
    std::uint64_t reversed = 0;
    for (std::uint64_t rest = n; rest > 0; rest /= 10) reversed = reversed * 10 + rest % 10;
    return Facts{n, false, reversed == n};
  }
};

// Joins the two branches' facts about one number (parts in the order of its inputs).
class Both final : public flowtrain::Join<Facts, Facts> {
 protected:
  std::optional<Facts> process(std::vector<Facts>&& parts, flowtrain::ItemContext&) override {
    return Facts{parts[0].n, parts[0].prime, parts[1].palindrome};
  }
};

class Tally final : public flowtrain::Sink<Facts> {
 public:
  std::uint64_t primes = 0;
  std::uint64_t palindromes = 0;
  std::uint64_t last = 0;

 protected:
  void consume(Facts&& f, flowtrain::ItemContext&) override {
    if (!f.prime) return;
    ++primes;  // serial sink: no lock needed
    palindromes += f.palindrome ? 1 : 0;
    last = f.n;
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
        .add("is_palindrome", std::make_unique<IsPalindrome>(),
             {.queue_capacity = 16, .inputs = {"numbers"}})
        .add("both", std::make_unique<Both>(), {.inputs = {"is_prime", "is_palindrome"}})
        .add("tally", std::move(tally), {.queue_capacity = 16, .ordered = true});
    std::cout << flowtrain::graph_text(pipeline.decls()) << "\n";
    const flowtrain::RunReport report = pipeline.run({.threads = 2});

    std::cout << result.primes << " primes below " << count << ", the largest " << result.last
              << "; " << result.palindromes << " of them palindromes\n\n"
              << flowtrain::format_report(report);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "custom_stage: error: " << e.what() << "\n";
    return 1;
  }
}
