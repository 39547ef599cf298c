#include <doctest/doctest.h>
#include <torch/torch.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "graph/error.hpp"
#include "stages/train/files/checkpoint.hpp"
#include "stages/train/models/vit.hpp"
#include "stages/train/step/optimizer.hpp"
#include "tests/train/training_fixture.hpp"

using namespace flowtrain;
using namespace flowtrain::train;
using namespace flowtrain::testing;
namespace fs = std::filesystem;

TEST_CASE("Train.Checkpoint.RoundTripAndLatest" * doctest::timeout(60)) {
  TempDir dir;
  torch::manual_seed(5);
  ViT model(ModelConfig{.image_size = 32, .patch_size = 8, .dim = 16, .depth = 1, .heads = 2,
                      .classes = 3, .regression_outputs = 1});
  auto adamw = make_adamw(model, {});
  // One step, so the optimizer has state to save.
  model->forward(torch::randn({2, 3, 32, 32})).logits.sum().backward();
  adamw->step();
  const TrainState state{.step = 7,
                         .total_steps = 30,
                         .epoch = 2,
                         .data_position = 224,
                         .shared_data_position = 448,
                         .skipped_steps = 1};
  save_checkpoint(dir / step_checkpoint_name(7), model, adamw.get(), state);
  CHECK_FALSE(fs::exists(dir / (step_checkpoint_name(7) + ".tmp")));

  const Checkpoint read = read_checkpoint(dir / step_checkpoint_name(7));
  CHECK(read.state.step == 7);
  CHECK(read.state.total_steps == 30);
  CHECK(read.state.epoch == 2);
  CHECK(read.state.data_position == 224);
  CHECK(read.state.shared_data_position == 448);
  CHECK(read.state.skipped_steps == 1);
  CHECK(config_difference(read.config, model->config()).empty());

  torch::manual_seed(6);  // different initial weights
  ViT other(model->config());
  auto other_adamw = make_adamw(other, {});
  restore_training(read, other, other_adamw.get());
  const auto a = model->named_parameters(), b = other->named_parameters();
  for (const auto& item : a) CHECK(torch::equal(item.value(), b[item.key()]));

  // The newest step file wins; final.pt wins over any step.
  save_checkpoint(dir / step_checkpoint_name(12), model, adamw.get(), state);
  CHECK(latest_checkpoint(dir.path())->path == dir / step_checkpoint_name(12));
  // A step of two ranks counts once both wrote it, whatever the ranks resuming it.
  TrainState two_ranks = state;
  two_ranks.world_size = 2;
  save_checkpoint(dir / step_checkpoint_name(14), model, adamw.get(), two_ranks);
  CHECK(latest_checkpoint(dir.path())->path == dir / step_checkpoint_name(12));
  save_checkpoint(rank_file(dir / step_checkpoint_name(14), 1), model, adamw.get(), two_ranks);
  CHECK(latest_checkpoint(dir.path())->path == dir / step_checkpoint_name(14));
  save_checkpoint(dir / "final.pt", model, nullptr, state);
  CHECK(latest_checkpoint(dir.path())->path == dir / "final.pt");
  CHECK_FALSE(latest_checkpoint(dir / "missing").has_value());

  // A different shape is refused with what differs.
  ViT wider(ModelConfig{.image_size = 32, .patch_size = 8, .dim = 32, .depth = 1, .heads = 2,
                      .classes = 3, .regression_outputs = 1});
  auto wider_adamw = make_adamw(wider, {});
  CHECK_THROWS_WITH_AS(restore_training(read, wider, wider_adamw.get()),
                       doctest::Contains("dim 16 in the file, 32 configured"), Error);
  // A model-only file cannot resume training.
  CHECK_THROWS_WITH_AS(
      restore_training(read_checkpoint(dir / "final.pt"), other, other_adamw.get()),
      doctest::Contains("no optimizer state"), Error);
  // Files that are not checkpoints.
  std::ofstream(dir / "text.pt") << "hello";
  CHECK_FALSE(is_checkpoint(dir / "text.pt"));
  CHECK_THROWS_WITH_AS(read_checkpoint(dir / "text.pt"),
                       doctest::Contains("not a flowtrain checkpoint"), Error);
  CHECK_THROWS_WITH_AS(read_checkpoint(dir / "none.pt"), doctest::Contains("no such"), Error);
}

TEST_CASE("Train.Checkpoint.DamagedFileIsOneLineNamingTheEntry") {
  // A byte flipped inside a tensor's data would load silently as a wrong weight in LibTorch
  // 1.13, and damage in its code entries can crash its parser: the zip CRCs are checked first.
  TempDir dir;
  ViT model(ModelConfig{.image_size = 32, .patch_size = 8, .dim = 16, .depth = 1, .heads = 2,
                      .classes = 3});
  const std::string path = dir / "final.pt";
  save_checkpoint(path, model, nullptr, {});
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  CHECK(read_checkpoint(path).config.dim == 16);
  const std::string original = bytes;
  // The first weight's bytes: the local header of the archive's "data/0" entry, then its data.
  const std::size_t header = bytes.find("data/0");
  REQUIRE(header != std::string::npos);
  bytes[header + 200] ^= 0x10;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  CHECK_THROWS_WITH_AS(read_checkpoint(path),
                       doctest::Contains("final.pt: damaged checkpoint (entry '"), Error);
  CHECK_THROWS_WITH_AS(read_checkpoint(path), doctest::Contains("' fails its CRC check)"), Error);
  // Found by fuzzing: with the end record's entry count saturated (0xffff, "see the ZIP64
  // record"), the check used to leave the file to LibTorch, whose zip reader takes the count
  // from the ZIP64 record LibTorch writes into every file; a damaged code entry then crashed it.
  const std::size_t end = bytes.rfind("PK\x05\x06");
  REQUIRE(end != std::string::npos);
  bytes[end + 10] = bytes[end + 11] = '\xff';
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  CHECK_THROWS_WITH_AS(read_checkpoint(path), doctest::Contains("' fails its CRC check)"), Error);
  // Found by the ASan run of the fuzz smoke: a damaged name of the "version" entry (not covered
  // by any CRC) made LibTorch's reader throw from its constructor and leak its zip directory.
  for (const auto& [from, to, problem] :
       {std::tuple{"/version", "/vErsion", ""},  // LibTorch ignores the case of names
        std::tuple{"/version", "/versiom", "no entry 'archive/version'"},
        std::tuple{"archive/data/0", "archive_data_0",
                   "entry 'archive_data_0' is not in a folder"}}) {
    std::string renamed = original;
    for (std::size_t at = renamed.find(from); at != std::string::npos;
         at = renamed.find(from, at + 1)) {
      renamed.replace(at, std::strlen(to), to);
    }
    std::ofstream(path, std::ios::binary | std::ios::trunc) << renamed;
    if (*problem == 0) {
      CHECK(read_checkpoint(path).config.dim == 16);
    } else {
      const std::string message = std::string("damaged checkpoint (") + problem;
      CHECK_THROWS_WITH_AS(read_checkpoint(path), doctest::Contains(message.c_str()), Error);
    }
  }
}

TEST_CASE("Train.Checkpoint.ConfigLargerThanItsFileIsRefused") {
  // A damaged config field (depth 1'000'000 here) must not build a model of that size: the
  // file holds the weights, so its size bounds them.
  TempDir dir;
  ViT model(ModelConfig{.image_size = 32, .patch_size = 8, .dim = 16, .depth = 1, .heads = 2,
                        .classes = 3});
  const std::string good = dir / "good.pt", bad = dir / "bad.pt";
  save_checkpoint(good, model, nullptr, {});
  torch::serialize::InputArchive in;
  in.load_from(good);
  torch::serialize::OutputArchive out;
  for (const std::string& key : in.keys()) {
    c10::IValue value;
    if (key == "model" || !in.try_read(key, value)) continue;  // the config and state only
    out.write(key, key == "config.depth" ? c10::IValue(std::int64_t{1'000'000}) : value);
  }
  out.save_to(bad);
  CHECK(read_checkpoint(good).config.depth == 1);
  CHECK_THROWS_WITH_AS(read_checkpoint(bad),
                       doctest::Contains("bad.pt: damaged checkpoint (its config, ViT dim 16 "
                                         "depth 1000000 heads 2 patch 8, has at least "),
                       Error);
}

TEST_CASE("Train.Checkpoint.UnwritableFolderNamesPath") {
  ViT model(ModelConfig{.image_size = 32, .patch_size = 8, .dim = 16, .depth = 1, .heads = 2,
                      .classes = 3});
  CHECK_THROWS_WITH_AS(save_checkpoint("/nonexistent-folder/x.pt", model, nullptr, {}),
                       doctest::Contains("cannot write /nonexistent-folder/x.pt: cannot create"),
                       Error);
}

// The teacher learns the synthetic classes; a smaller student distilled from it gets close.
