// bench_graph_overhead: what the graph/ runtime costs per item, with stages that do nothing.
//
//   numbers -> [64] -> map_1 -> [64] -> ... -> map_5 -> [64] -> sink      (5 maps, 6 hops)
//   numbers -> [64] -> sink                                                (baseline, 1 hop)
//   numbers -+-> [64] -> a -> [64] -+-> join -> [64] -> sink             (fan-out + join, 5 hops)
//            +-> [64] -> b -> [64] -+
//
// Every stage is a no-op on std::uint64_t; the five maps run at concurrency 1, then 2; the
// graph gets 2 TBB threads. Each repetition builds a fresh Pipeline (a pipeline runs once) and
// times Pipeline::run with steady_clock; a warm-up run precedes each configuration, and the
// table shows the median over repetitions.
//
// Run: build/bench/bench_graph_overhead --items 1000000 --reps 5
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <exception>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench_util.hpp"
#include "graph/error.hpp"
#include "graph/freed_memory.hpp"
#include "graph/pipeline.hpp"

namespace {

using flowtrain::bench::median;

constexpr std::size_t kQueueCapacity = 64;
constexpr std::size_t kThreads = 2;
constexpr int kMaps = 5;

class Numbers final : public flowtrain::Source<std::uint64_t> {
 public:
  explicit Numbers(std::uint64_t count) : count_(count) {}

 protected:
  std::optional<std::uint64_t> next() override {
    if (next_ == count_) return std::nullopt;
    return next_++;
  }

 private:
  std::uint64_t count_;
  std::uint64_t next_ = 0;
};

class Identity final : public flowtrain::Map<std::uint64_t, std::uint64_t> {
 protected:
  std::optional<std::uint64_t> process(std::uint64_t&& n, flowtrain::ItemContext&) override {
    return n;
  }
};

// Keeps the first part: a join that does no work.
class First final : public flowtrain::Join<std::uint64_t, std::uint64_t> {
 protected:
  std::optional<std::uint64_t> process(std::vector<std::uint64_t>&& parts,
                                       flowtrain::ItemContext&) override {
    return parts.front();
  }
};

class Discard final : public flowtrain::Sink<std::uint64_t> {
 public:
  std::uint64_t consumed = 0;

 protected:
  void consume(std::uint64_t&&, flowtrain::ItemContext&) override { ++consumed; }  // serial
};

struct Config {
  std::string name;
  int maps = 0;
  std::size_t map_concurrency = 1;
  bool join = false;  // the maps are two branches of a fan-out, joined before the sink

  int hops() const { return join ? 5 : maps + 1; }  // edges of the graph
};

struct Result {
  Config config;
  double median_s = 0;
  double min_s = 0;
  double max_s = 0;
};

double run_once(const Config& config, std::uint64_t items) {
  auto sink = std::make_unique<Discard>();
  const Discard& discard = *sink;
  flowtrain::Pipeline pipeline;
  pipeline.add("numbers", std::make_unique<Numbers>(items));
  if (config.join) {
    for (const char* branch : {"a", "b"}) {
      pipeline.add(branch, std::make_unique<Identity>(),
                   {.concurrency = config.map_concurrency,
                    .queue_capacity = kQueueCapacity,
                    .inputs = {"numbers"}});
    }
    pipeline.add("join", std::make_unique<First>(),
                 {.concurrency = config.map_concurrency,
                  .queue_capacity = kQueueCapacity,
                  .inputs = {"a", "b"}});
  }
  for (int i = 1; !config.join && i <= config.maps; ++i) {
    pipeline.add("map_" + std::to_string(i), std::make_unique<Identity>(),
                 {.concurrency = config.map_concurrency, .queue_capacity = kQueueCapacity});
  }
  pipeline.add("sink", std::move(sink), {.queue_capacity = kQueueCapacity});

  const auto start = std::chrono::steady_clock::now();
  pipeline.run({.threads = kThreads});
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  // A run that lost items would look fast for the wrong reason.
  if (discard.consumed != items) {
    throw flowtrain::Error(config.name + ": sink saw " + std::to_string(discard.consumed) + " of " +
                           std::to_string(items) + " items");
  }
  return seconds;
}

Result measure(const Config& config, std::uint64_t items, int reps) {
  run_once(config, items);  // warm-up: first-touch allocations, TBB thread start-up
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) times.push_back(run_once(config, items));
  return {config, median(times), *std::min_element(times.begin(), times.end()),
          *std::max_element(times.begin(), times.end())};
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%a %b %e %H:%M:%S UTC %Y", &tm);
  return buf;
}

std::uint64_t parse_positive(const std::string& flag, const char* text) {
  std::size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || text[used] != '\0' || value <= 0) {
    throw flowtrain::Error(flag + " needs a positive integer, got '" + text + "'");
  }
  return static_cast<std::uint64_t>(value);
}

std::string fixed(double value, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, value);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  flowtrain::keep_freed_memory();  // as the apps run (runner::run_phases)
  try {
    std::uint64_t items = 1'000'000;
    int reps = 5;
    std::string command = argv[0];
    for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if ((arg == "--items" || arg == "--reps") && i + 1 < argc) {
        const std::uint64_t value = parse_positive(arg, argv[++i]);
        if (arg == "--items") {
          items = value;
        } else {
          reps = static_cast<int>(std::min<std::uint64_t>(value, 1000));
        }
      } else if (arg == "--help" || arg == "-h") {
        std::cout << "usage: bench_graph_overhead [--items N] [--reps R]\n";
        return 0;
      } else {
        throw flowtrain::Error("unknown or incomplete argument '" + arg + "' (try --help)");
      }
    }

    const std::vector<Config> configs = {
        {"source -> sink (baseline)", 0, 1},
        {"source -> 5 maps (conc 1) -> sink", kMaps, 1},
        {"source -> 5 maps (conc 2) -> sink", kMaps, 2},
        {"source -> 2 maps (fan-out) -> join -> sink", 3, 1, true},
    };
    std::vector<Result> results;
    for (const Config& config : configs) results.push_back(measure(config, items, reps));

    const double n = static_cast<double>(items);
    const double baseline_ns = results.front().median_s * 1e9 / n;
    std::cout << "command: " << command << "\n"
              << "date: " << utc_now() << "\n"
              << "items per run: " << items << ", reps: " << reps << " (median shown)"
              << ", threads: " << kThreads << ", queue capacity: " << kQueueCapacity << "\n\n"
              << "| configuration | hops | items/s | ns/item | ns/item/hop"
              << " | ns/hop (minus baseline) | ns/item min..max |\n"
              << "|---|---:|---:|---:|---:|---:|---:|\n";
    for (const Result& r : results) {
      const int hops = r.config.hops();
      const double ns_per_item = r.median_s * 1e9 / n;
      const std::string subtracted =
          r.config.maps > 0 ? fixed((ns_per_item - baseline_ns) / (hops - 1), 0) : "-";
      std::cout << "| " << r.config.name << " | " << hops << " | " << fixed(n / r.median_s, 0)
                << " | " << fixed(ns_per_item, 0) << " | " << fixed(ns_per_item / hops, 0) << " | "
                << subtracted << " | " << fixed(r.min_s * 1e9 / n, 0) << ".."
                << fixed(r.max_s * 1e9 / n, 0) << " |\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_graph_overhead: error: " << e.what() << "\n";
    return 1;
  }
}
