#include "graph/mix.hpp"

#include "graph/error.hpp"

namespace flowtrain {

namespace {
// splitmix64's finaliser: a well-mixed 64-bit hash of x.
std::uint64_t hash64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
}  // namespace

MixStage::MixStage(const Options& options) : options_(options) {}

StageDoc MixStage::describe() {
  return {"A source made of two or more sources (its inputs): each item comes from one of "
          "them, chosen at random with the given weights from (seed, item number), so the "
          "order is the same on every run. Sources come first; the mix takes them all.",
          option_specs<Options>()};
}

void MixStage::check_inputs(const std::string& name, std::size_t inputs) const {
  const std::vector<double>& w = options_.weights;
  if (w.empty()) return;
  const std::string label = "mix '" + name + "': param 'weights' ";
  if (w.size() != inputs) {
    throw Error(label + "has " + std::to_string(w.size()) + " values for " +
                std::to_string(inputs) + " inputs; give one per input, in their order");
  }
  double total = 0;
  for (const double v : w) {
    if (!(v >= 0)) throw Error(label + "must hold numbers >= 0");
    total += v;
  }
  if (total <= 0) throw Error(label + "must not all be 0");
}

std::optional<std::size_t> MixStage::pick(std::uint64_t k, const std::vector<bool>& alive) const {
  return choose(start_ + k, alive);
}

std::optional<std::size_t> MixStage::choose(std::uint64_t k, const std::vector<bool>& alive) const {
  double total = 0;
  for (std::size_t i = 0; i < alive.size(); ++i) {
    if (!alive[i] && options_.stop_on_first_empty) return std::nullopt;
    if (alive[i]) total += options_.weights.empty() ? 1.0 : options_.weights[i];
  }
  if (total <= 0) return std::nullopt;
  // A uniform draw in [0, total) from (seed, k) alone.
  const double unit =
      static_cast<double>(hash64(hash64(static_cast<std::uint64_t>(options_.seed)) ^ k) >> 11) *
      0x1.0p-53;
  double at = unit * total;
  std::optional<std::size_t> last;
  for (std::size_t i = 0; i < alive.size(); ++i) {
    if (!alive[i]) continue;
    const double w = options_.weights.empty() ? 1.0 : options_.weights[i];
    if (w <= 0) continue;
    last = i;
    if (at < w) return i;
    at -= w;
  }
  return last;  // rounding at the top end
}

std::optional<std::vector<std::uint64_t>> MixStage::split(
    std::uint64_t position, const std::vector<std::optional<std::uint64_t>>& sizes) const {
  std::vector<std::uint64_t> taken(sizes.size(), 0);
  std::vector<bool> alive(sizes.size(), true);
  for (std::uint64_t k = 0; k < position;) {
    const std::optional<std::size_t> port = choose(k, alive);
    if (!port) break;
    if (!sizes[*port]) return std::nullopt;
    if (taken[*port] == *sizes[*port]) {
      alive[*port] = false;  // as the run found it: its next() returned nothing
      continue;
    }
    ++taken[*port];
    ++k;
  }
  return taken;
}

}  // namespace flowtrain
