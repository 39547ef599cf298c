#include "apps/custom_stage/prime_stages.hpp"

namespace custom_stage {

bool is_prime(std::uint64_t n) {
  if (n < 2) return false;
  for (std::uint64_t d = 2; d * d <= n; ++d) {
    if (n % d == 0) return false;
  }
  return true;
}

bool is_palindrome(std::uint64_t n) {
  std::uint64_t reversed = 0;
  for (std::uint64_t rest = n; rest > 0; rest /= 10) reversed = reversed * 10 + rest % 10;
  return reversed == n;
}

flowtrain::StageDoc IsPrimeStage::describe() {
  return {"Whether a number is prime (trial division). Takes unsigned long, emits Facts.", {}};
}

std::optional<Facts> IsPrimeStage::process(std::uint64_t&& n, flowtrain::ItemContext& /*ctx*/) {
  return Facts{n, is_prime(n)};
}

flowtrain::StageDoc IsPalindromeStage::describe() {
  return {"Whether a number reads the same backwards in decimal. Takes unsigned long, emits Facts.",
          {}};
}

std::optional<Facts> IsPalindromeStage::process(std::uint64_t&& n,
                                                flowtrain::ItemContext& /*ctx*/) {
  return Facts{n, false, is_palindrome(n)};
}

flowtrain::StageDoc JoinFactsStage::describe() {
  return {
      "Joins two branches' Facts about one number: the first's prime, the second's "
      "palindrome.",
      {}};
}

std::optional<Facts> JoinFactsStage::process(std::vector<Facts>&& parts,
                                             flowtrain::ItemContext& /*ctx*/) {
  return Facts{parts[0].n, parts[0].prime, parts[1].palindrome};
}

flowtrain::StageDoc CountPrimesStage::describe() {
  return {"Counts primes and palindromic primes and keeps the largest prime (its results).", {}};
}

void CountPrimesStage::consume(Facts&& facts, flowtrain::ItemContext& /*ctx*/) {
  if (!facts.prime) return;
  ++primes_;
  palindromes_ += facts.palindrome ? 1 : 0;
  largest_ = facts.n;
}

std::vector<flowtrain::StageResult> CountPrimesStage::results() const {
  return {{"primes", static_cast<double>(primes_)},
          {"palindromes", static_cast<double>(palindromes_)},
          {"largest", static_cast<double>(largest_)}};
}

FLOWTRAIN_REGISTER_STAGE("is_prime", IsPrimeStage);
FLOWTRAIN_REGISTER_STAGE("is_palindrome", IsPalindromeStage);
FLOWTRAIN_REGISTER_STAGE("join_facts", JoinFactsStage);
FLOWTRAIN_REGISTER_STAGE("count_primes", CountPrimesStage);

}  // namespace custom_stage
