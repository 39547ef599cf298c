#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "graph/registry.hpp"

// Stages of one's own, registered by name: the custom_stage example links them into its own
// `main`, and libprime_stages.so, a plugin built from the same source, makes them usable from
// YAML with the flowtrain CLI (`flowtrain run --plugin`, or a config's `plugins:`).
namespace custom_stage {

/// What the branches find out about a number; each fills in its own field.
struct Facts {
  std::uint64_t n = 0;
  bool prime = false;
  bool palindrome = false;
};

/// Whether `n` is prime, by trial division.
bool is_prime(std::uint64_t n);
/// Whether `n` reads the same backwards in decimal (0, 7, 121).
bool is_palindrome(std::uint64_t n);

/// `is_prime`: whether n is prime, by trial division. Any concurrency.
class IsPrimeStage final : public flowtrain::Map<std::uint64_t, Facts> {
 public:
  using Options = flowtrain::NoOptions;
  explicit IsPrimeStage(const Options& = {}) {}
  static flowtrain::StageDoc describe();

 protected:
  std::optional<Facts> process(std::uint64_t&& n, flowtrain::ItemContext& ctx) override;
};

/// `is_palindrome`: whether n reads the same backwards in decimal. Any concurrency.
class IsPalindromeStage final : public flowtrain::Map<std::uint64_t, Facts> {
 public:
  using Options = flowtrain::NoOptions;
  explicit IsPalindromeStage(const Options& = {}) {}
  static flowtrain::StageDoc describe();

 protected:
  std::optional<Facts> process(std::uint64_t&& n, flowtrain::ItemContext& ctx) override;
};

/// `join_facts`: the facts of one number from two branches, the first's `prime` and the
/// second's `palindrome` (parts come in the order of its inputs).
class JoinFactsStage final : public flowtrain::Join<Facts, Facts> {
 public:
  using Options = flowtrain::NoOptions;
  explicit JoinFactsStage(const Options& = {}) {}
  static flowtrain::StageDoc describe();

 protected:
  std::optional<Facts> process(std::vector<Facts>&& parts, flowtrain::ItemContext& ctx) override;
};

/// `count_primes`: counts the primes and the palindromic primes and keeps the largest prime,
/// reported as its results (`primes`, `palindromes`, `largest`). Serial, in sequence order, so
/// the largest is the last prime seen.
class CountPrimesStage final : public flowtrain::SerialSink<Facts> {
 public:
  using Options = flowtrain::NoOptions;
  explicit CountPrimesStage(const Options& = {}) {}
  static flowtrain::StageDoc describe();

  std::uint64_t primes() const { return primes_; }
  std::uint64_t palindromes() const { return palindromes_; }
  std::uint64_t largest() const { return largest_; }
  std::vector<flowtrain::StageResult> results() const override;

 protected:
  void consume(Facts&& facts, flowtrain::ItemContext& ctx) override;

 private:
  std::uint64_t primes_ = 0;
  std::uint64_t palindromes_ = 0;
  std::uint64_t largest_ = 0;
};

}  // namespace custom_stage
