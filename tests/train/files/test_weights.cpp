#include <caffe2/serialize/inline_container.h>
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "graph/error.hpp"
#include "stages/train/files/checkpoint.hpp"
#include "stages/train/files/torchscript.hpp"
#include "stages/train/files/weights.hpp"
#include "stages/train/inference/inference_model.hpp"
#include "stages/train/step/trainer.hpp"
#include "tests/temp_dir.hpp"

using namespace flowtrain;
using namespace flowtrain::train;
using flowtrain::testing::TempDir;
namespace fs = std::filesystem;

namespace {

ModelConfig small_vit(int classes = 5) {
  return ModelConfig{.image_size = 16, .patch_size = 8, .dim = 16, .depth = 2, .heads = 2,
                     .classes = classes};
}

ModelConfig small_resnet(int classes = 5) {
  return ModelConfig{.arch = "resnet", .image_size = 16, .dim = 4, .classes = classes,
                     .stage_blocks = {1, 1}, .stem = "compact"};
}

// A model from `seed`, its BatchNorm statistics made non-trivial so that buffers count too.
ImageModel model_from(const ModelConfig& config, int seed) {
  torch::manual_seed(seed);
  ImageModel model = make_model(config);
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_buffers()) {
    if (item.value().is_floating_point()) item.value().uniform_(0.5, 1.5);
    else item.value().fill_(seed);
  }
  return model;
}

// Whether every parameter and buffer of `a` equals `b`'s of the same name, bit for bit.
void check_same_tensors(const torch::nn::Module& a, const torch::nn::Module& b) {
  const StateDict left = model_weights(a), right = model_weights(b);
  REQUIRE(left.size() == right.size());
  for (std::size_t i = 0; i < left.size(); ++i) {
    CAPTURE(left[i].first);
    REQUIRE(left[i].first == right[i].first);
    CHECK(torch::equal(left[i].second, right[i].second));
  }
}

template <class Call>
std::string error_of(Call&& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("not a flowtrain::Error: " << e.what());
  }
  FAIL("no error thrown");
  return {};
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

}  // namespace

TEST_CASE("Train.Weights.RoundTripsGiveIdenticalTensors" * doctest::timeout(120)) {
  TempDir dir("weights");
  for (const ModelConfig& config : {small_vit(), small_resnet()}) {
    for (const WeightsFormat format : {WeightsFormat::kStateDict, WeightsFormat::kSafetensors}) {
      CAPTURE(config.describe());
      CAPTURE(static_cast<int>(format));
      const ImageModel saved = model_from(config, 1);
      const std::string path = dir.str("weights.bin");
      write_weights(path, model_weights(*saved), format);
      ImageModel loaded = model_from(config, 2);
      const InitCounts counts = init_weights(*loaded, {.path = path});
      CHECK(counts.loaded == model_weights(*saved).size());
      CHECK(counts.skipped == 0);
      CHECK(counts.layout == "flowtrain");
      check_same_tensors(*saved, *loaded);
    }
  }
}

TEST_CASE("Train.Weights.SafetensorsKeepsEveryDtype") {
  const StateDict weights = {
      {"f32", torch::randn({2, 3})},
      {"f16", torch::randn({4}).to(torch::kHalf)},
      {"bf16", torch::randn({1, 2}).to(torch::kBFloat16)},
      {"f64", torch::randn({3}, torch::kDouble)},
      {"i64", torch::arange(5)},
      {"i32", torch::arange(3).to(torch::kInt)},
      {"scalar", torch::tensor(7)},
      {"empty", torch::empty({0, 4})},
  };
  const std::string bytes = weights_bytes(weights, WeightsFormat::kSafetensors);
  CHECK((bytes.size() - 8) % 8 == 0);  // the header padded: the data 8-byte aligned
  const StateDict back = parse_safetensors(
      {reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()}, "x.safetensors");
  REQUIRE(back.size() == weights.size());
  for (std::size_t i = 0; i < back.size(); ++i) {
    CAPTURE(weights[i].first);
    CHECK(back[i].first == weights[i].first);
    CHECK((back[i].second.scalar_type() == weights[i].second.scalar_type()));
    CHECK(torch::equal(back[i].second, weights[i].second));
  }
}

TEST_CASE("Train.Weights.TorchvisionLayoutOfTheViT" * doctest::timeout(60)) {
  TempDir dir("weights");
  const ImageModel vit = model_from(small_vit(), 3);
  const StateDict torchvision = model_weights(*vit, WeightsLayout::kTorchvision);
  std::vector<std::string> names;
  for (const auto& [name, tensor] : torchvision) names.push_back(name);
  // torchvision 0.14's VisionTransformer names, as its state_dict() lists them.
  for (const char* expected :
       {"conv_proj.weight", "class_token", "encoder.pos_embedding",
        "encoder.layers.encoder_layer_1.ln_1.weight",
        "encoder.layers.encoder_layer_0.self_attention.in_proj_weight",
        "encoder.layers.encoder_layer_0.self_attention.in_proj_bias",
        "encoder.layers.encoder_layer_0.self_attention.out_proj.bias",
        "encoder.layers.encoder_layer_0.ln_2.bias", "encoder.layers.encoder_layer_0.mlp.0.weight",
        "encoder.layers.encoder_layer_1.mlp.3.bias", "encoder.ln.weight", "heads.head.weight"}) {
    CAPTURE(expected);
    CHECK(std::find(names.begin(), names.end(), expected) != names.end());
  }
  CHECK(names.size() == model_weights(*vit).size());
  // ... and read back into our names.
  const std::string path = dir.str("torchvision.pth");
  write_weights(path, torchvision, WeightsFormat::kStateDict);
  ImageModel loaded = model_from(small_vit(), 4);
  CHECK(init_weights(*loaded, {.path = path}).layout == "torchvision");
  check_same_tensors(*vit, *loaded);

  // What torchvision has no place for is refused, by name.
  ModelConfig regression = small_vit();
  regression.regression_outputs = 1;
  std::string error = error_of(
      [&] { model_weights(*model_from(regression, 1), WeightsLayout::kTorchvision); });
  CHECK(contains(error, "no place for 'regression_head.weight' (a regression head)"));
  ModelConfig deit = small_vit();
  deit.distillation_token = true;
  error = error_of([&] { model_weights(*model_from(deit, 1), WeightsLayout::kTorchvision); });
  CHECK(contains(error, "'dist_token' (DeiT's distillation token)"));
  // The ResNet's names are torchvision's already.
  const ImageModel resnet = model_from(small_resnet(), 1);
  const StateDict ours = model_weights(*resnet), theirs = model_weights(*resnet, WeightsLayout::kTorchvision);
  REQUIRE(ours.size() == theirs.size());
  for (std::size_t i = 0; i < ours.size(); ++i) CHECK(ours[i].first == theirs[i].first);
}

TEST_CASE("Train.Weights.MismatchNamesTheFileAndTheKey" * doctest::timeout(60)) {
  TempDir dir("weights");
  const ImageModel source = model_from(small_vit(), 1);
  const StateDict full = model_weights(*source);
  ImageModel target = model_from(small_vit(), 2);
  const StateDict before = model_weights(*target);
  const auto init_error = [&](const StateDict& weights, const std::string& name) {
    const std::string path = dir.str(name);
    write_weights(path, weights, WeightsFormat::kStateDict);
    const std::string error = error_of([&] { init_weights(*target, {.path = path}); });
    CHECK(contains(error, path + ": "));
    CHECK(error.find('\n') == std::string::npos);
    return error;
  };

  StateDict missing = full;
  missing.erase(std::find_if(missing.begin(), missing.end(),
                             [](const auto& item) { return item.first == "head.bias"; }));
  CHECK(contains(init_error(missing, "missing.pth"), "missing key 'head.bias' [5]"));

  StateDict extra = full;
  extra.emplace_back("extra.weight", torch::zeros({3}));
  CHECK(contains(init_error(extra, "extra.pth"), "unexpected key 'extra.weight' [3]"));

  const StateDict other_classes = model_weights(*model_from(small_vit(3), 1));
  CHECK(contains(init_error(other_classes, "classes.pth"),
                 "key 'head.weight' is [3, 16] in the file but [5, 16] in the model"));

  StateDict wrong_dtype = full;
  wrong_dtype[0].second = wrong_dtype[0].second.to(torch::kLong);
  CHECK(contains(init_error(wrong_dtype, "dtype.pth"), "is Long in the file but Float"));

  // A failed init leaves the model as it was.
  check_same_tensors(*target, *model_from(small_vit(), 2));
  CHECK(before.size() == model_weights(*target).size());

  CHECK(contains(error_of([&] { init_weights(*target, {.path = dir.str("none.pth")}); }),
                 "none.pth: no such weights file"));
  write_bytes(dir.str("text.pth"), "not weights at all\n");
  CHECK(contains(error_of([&] { init_weights(*target, {.path = dir.str("text.pth")}); }),
                 "text.pth: not a weights file"));
}

TEST_CASE("Train.Weights.InitSkipLeavesPrefixesAsInitialised" * doctest::timeout(60)) {
  TempDir dir("weights");
  const std::string path = dir.str("three_classes.safetensors");
  const ImageModel source = model_from(small_resnet(3), 1);
  write_weights(path, model_weights(*source), WeightsFormat::kSafetensors);
  ImageModel target = model_from(small_resnet(5), 2);
  const ImageModel initial = model_from(small_resnet(5), 2);
  CHECK((skip_prefixes(" fc , layer9") == std::vector<std::string>{"fc", "layer9"}));
  const InitCounts counts = init_weights(*target, {.path = path, .skip = {"fc"}});
  CHECK(counts.skipped == 2);  // fc.weight, fc.bias
  CHECK(counts.loaded == model_weights(*target).size() - 2);
  const StateDict got = model_weights(*target), file = model_weights(*source),
                  init = model_weights(*initial);
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(got[i].first);
    const bool head = got[i].first.rfind("fc.", 0) == 0;
    CHECK(torch::equal(got[i].second, head ? init[i].second : file[i].second));
  }
  // A prefix is whole components: "fc" does not cover a name that only begins with it.
  ModelConfig vit = small_vit();
  vit.distillation_token = true;
  const std::string deit_path = dir.str("deit.pth");
  write_weights(deit_path, model_weights(*model_from(vit, 1)), WeightsFormat::kStateDict);
  ImageModel deit = model_from(vit, 2);
  CHECK(init_weights(*deit, {.path = deit_path, .skip = {"head"}}).skipped == 2);  // not head_dist
}

TEST_CASE("Train.Weights.DataParallelModulePrefixIsDropped") {
  TempDir dir("weights");
  const ImageModel source = model_from(small_vit(), 1);
  StateDict wrapped = model_weights(*source);
  for (auto& item : wrapped) item.first = "module." + item.first;
  write_weights(dir.str("ddp.pth"), wrapped, WeightsFormat::kStateDict);
  ImageModel target = model_from(small_vit(), 2);
  init_weights(*target, {.path = dir.str("ddp.pth")});
  check_same_tensors(*source, *target);
}

TEST_CASE("Train.Weights.DamagedSafetensorsIsOneLineError" * doctest::timeout(120)) {
  TempDir dir("weights");
  const StateDict weights = {{"a", torch::randn({3, 2})}, {"b", torch::arange(4)}};
  const std::string good = weights_bytes(weights, WeightsFormat::kSafetensors);
  const auto check_refused = [&](const std::string& bytes) {
    const std::string path = dir.str("damaged.safetensors");
    write_bytes(path, bytes);
    try {
      const StateDict read = read_weights(path);
      // A change that leaves a valid file (a digit of the data) reads as such a file.
      CHECK(read.size() <= weights.size());
    } catch (const Error& e) {
      const std::string what = e.what();
      CHECK(what.find('\n') == std::string::npos);
      CHECK(contains(what, path));
    }
  };
  // Every truncation, and every byte of the header changed.
  for (std::size_t size = 0; size < good.size(); ++size) check_refused(good.substr(0, size));
  const std::size_t header_end = 8 + static_cast<unsigned char>(good[0]) +
                                 256 * static_cast<unsigned char>(good[1]);
  for (std::size_t i = 0; i < header_end; ++i) {
    for (const char replacement : {'\0', '\xff', '9', '"', '}', '[', '-'}) {
      std::string bad = good;
      bad[i] = replacement;
      check_refused(bad);
    }
  }
  // The reasons are said.
  std::string huge = good;
  huge[7] = '\x7f';
  write_bytes(dir.str("huge.safetensors"), huge);
  CHECK(contains(error_of([&] { read_weights(dir.str("huge.safetensors")); }),
                 "huge.safetensors: damaged safetensors file (a header of "));
  std::string offsets = good;
  const std::size_t at = offsets.find("[0,24]");
  REQUIRE(at != std::string::npos);
  offsets.replace(at, 6, "[0,99]");
  write_bytes(dir.str("offsets.safetensors"), offsets);
  CHECK(contains(error_of([&] { read_weights(dir.str("offsets.safetensors")); }),
                 "tensor 'a': data_offsets [0, 99] outside"));
}

TEST_CASE("Train.Weights.TrainerTakesInitUnlessResumed" * doctest::timeout(120)) {
  TempDir dir("weights");
  const ImageModel source = model_from(small_vit(), 7);
  write_weights(dir.str("init.safetensors"), model_weights(*source), WeightsFormat::kSafetensors);
  TrainerOptions options{.model = small_vit(), .seed = 1};
  options.init = {.path = dir.str("init.safetensors")};
  Trainer trainer(options);
  REQUIRE(trainer.init_counts().has_value());
  CHECK(trainer.init_counts()->loaded == model_weights(*source).size());
  check_same_tensors(*source, *trainer.model());

  // A flowtrain checkpoint is an init file too; and a resumed run takes its checkpoint's
  // weights, not init's.
  TrainerOptions plain{.model = small_vit(), .seed = 2};
  Trainer other(plain);
  const std::string checkpoint = dir.str("step.pt");
  write_bytes(checkpoint, other.checkpoint(/*with_optimizer=*/true));
  const Checkpoint resume_from = read_checkpoint(checkpoint);
  Trainer resumed(options, nullptr, &resume_from);
  CHECK_FALSE(resumed.init_counts().has_value());
  check_same_tensors(*other.model(), *resumed.model());
  options.init = {.path = checkpoint};
  Trainer from_checkpoint(options);
  check_same_tensors(*other.model(), *from_checkpoint.model());
  // An init error names the param.
  options.init = {.path = dir.str("missing.pth")};
  CHECK(contains(error_of([&] { Trainer failing(options); }),
                 "param 'init': " + dir.str("missing.pth") + ": no such weights file"));
}

TEST_CASE("Train.Weights.TeacherInitGivesTheCheckpointOtherWeights" * doctest::timeout(120)) {
  TempDir dir("weights");
  Trainer trainer(TrainerOptions{.model = small_resnet(), .seed = 3});
  const std::string checkpoint = dir.str("teacher.pt");
  write_bytes(checkpoint, trainer.checkpoint(/*with_optimizer=*/false));
  ImageModel source = model_from(small_resnet(), 9);
  source->eval();
  const std::string weights = dir.str("teacher.safetensors");
  write_weights(weights, model_weights(*source), WeightsFormat::kSafetensors);

  const torch::Tensor images = torch::randn({2, 3, 16, 16});
  const torch::Tensor expected = source->forward(images).logits;
  const auto teacher = InferenceModel::load(checkpoint, InferenceModel::Precision::kFloat32, weights);
  CHECK(torch::equal(teacher->forward(images).logits, expected));
  const auto plain = InferenceModel::load(checkpoint);
  CHECK_FALSE(torch::equal(plain->forward(images).logits, expected));

  // A TorchScript teacher carries its own weights.
  const std::string scripted = dir.str("teacher_script.pt");
  export_torchscript(source, scripted);
  CHECK(contains(error_of([&] { InferenceModel::load(scripted, {}, weights); }),
                 "param 'init': " + scripted + " is a TorchScript module"));
}

namespace {

// A pickle written opcode by opcode (protocol 2), as torch.save writes a state_dict's.
struct Pickle {
  std::string bytes = "\x80\x02";
  Pickle& op(char c) {
    bytes += c;
    return *this;
  }
  Pickle& str(const std::string& s) {
    bytes += 'X';
    for (int i = 0; i < 4; ++i) bytes += static_cast<char>((s.size() >> (8 * i)) & 0xff);
    bytes += s;
    return *this;
  }
  Pickle& global(const std::string& module, const std::string& name) {
    bytes += "c" + module + "\n" + name + "\n";
    return *this;
  }
  Pickle& small_int(std::uint8_t v) {
    bytes += 'K';
    bytes += static_cast<char>(v);
    return *this;
  }
  Pickle& ordered_dict() { return global("collections", "OrderedDict").op(')').op('R'); }
  // A float tensor [n] over storage `key` (n elements): _rebuild_tensor_v2's call.
  Pickle& tensor(const std::string& key, std::uint8_t n) {
    global("torch._utils", "_rebuild_tensor_v2").op('(');
    op('(').str("storage").global("torch", "FloatStorage").str(key).str("cpu").small_int(n);
    op('t').op('Q');
    small_int(0).small_int(n).op('\x85').small_int(1).op('\x85').op('\x89');
    return ordered_dict().op('t').op('R');
  }
};

// A torch.save zip of `pickle` as data.pkl and `records` ("data/0" and its bytes), written by
// LibTorch's own zip writer as torch.save writes one; `compress` deflates the records.
std::string torch_save_zip(const std::string& pickle,
                           const std::vector<std::pair<std::string, std::string>>& records,
                           bool compress = false) {
  std::string out;
  {
    caffe2::serialize::PyTorchStreamWriter writer([&out](const void* data, std::size_t size) {
      out.append(static_cast<const char*>(data), size);
      return size;
    });
    writer.writeRecord("data.pkl", pickle.data(), pickle.size());
    for (const auto& [name, data] : records) {
      writer.writeRecord(name, data.data(), data.size(), compress);
    }
    writer.writeEndOfFile();
  }
  return out;
}

std::string floats(std::initializer_list<float> values) {
  std::string out;
  for (const float v : values) out.append(reinterpret_cast<const char*>(&v), sizeof v);
  return out;
}

}  // namespace

// A pickle nesting containers 100,000 deep crashed the reader (it recursed on the depth, in
// freeing what it built): refused in one line, the process alive; so are cycles through the memo.
TEST_CASE("Train.Weights.DeeplyNestedOrCyclicPicklesAreRefused" * doctest::timeout(120)) {
  TempDir dir("weights-nested");
  const auto refusal = [&](const std::string& pickle) {
    const std::string path = dir.str("nested.pt");
    write_bytes(path, torch_save_zip(pickle, {}));
    return error_of([&] { read_weights(path); });
  };
  constexpr int kDeep = 100000;
  Pickle lists;
  lists.bytes += std::string(kDeep, ']') + std::string(kDeep - 1, 'a');
  CHECK(contains(refusal(lists.op('.').bytes), "containers nested deeper than 100"));
  Pickle tuples;
  tuples.op(')').bytes += std::string(kDeep, '\x85');
  CHECK(contains(refusal(tuples.op('.').bytes), "containers nested deeper than 100"));
  Pickle dicts;  // {"model": {"model": ...}}: the reader looks inside "model"
  for (int i = 0; i < kDeep; ++i) {
    dicts.op('}');
    if (i + 1 < kDeep) dicts.str("model");
  }
  dicts.bytes += std::string(kDeep - 1, 's');
  CHECK(contains(refusal(dicts.op('.').bytes), "containers nested deeper than 100"));
  Pickle self;  // a dict holding itself under "model"
  self.op('}').op('q').bytes += '\0';
  self.str("model").op('h').bytes += '\0';
  CHECK(contains(refusal(self.op('s').op('.').bytes), "a container inside itself"));
  Pickle changed;  // a list changed after it went into another: the way to a cycle
  changed.op(']').op('q').bytes += '\0';
  changed.op(']').op('h').bytes += '\0';
  changed.op('a').op('q').bytes += '\1';  // outer [inner]
  changed.op('h').bytes += '\0';
  changed.op('h').bytes += '\1';
  CHECK(contains(refusal(changed.op('a').op('.').bytes),
                 "a container changed after it was placed in another"));
}

// A key given twice: torch.load keeps its last value (a dict's assignment); so does flowtrain.
TEST_CASE("Train.Weights.KeyGivenTwiceTakesTheLastAsTorchLoad" * doctest::timeout(120)) {
  TempDir dir("weights-twice");
  Pickle p;
  p.ordered_dict().op('(').str("w").tensor("0", 2).str("b").tensor("1", 1).str("w").tensor("2", 2);
  const std::string path = dir.str("twice.pt");
  write_bytes(path, torch_save_zip(p.op('u').op('.').bytes, {{"data/0", floats({1, 2})},
                                                              {"data/1", floats({5})},
                                                              {"data/2", floats({3, 4})}}));
  const StateDict read = read_weights(path);
  REQUIRE(read.size() == 2);
  CHECK(read[0].first == "w");
  CHECK(torch::equal(read[0].second, torch::tensor({3.0f, 4.0f})));
  CHECK(read[1].first == "b");
}

// A storage's entry holds exactly the storage the pickle gives it, checked before it is read or
// inflated: a 4-element storage over an entry of megabytes (stored, or a deflate bomb) is
// refused in one line.
TEST_CASE("Train.Weights.StorageEntriesHoldExactlyTheirStorage" * doctest::timeout(120)) {
  TempDir dir("weights-storage");
  Pickle p;
  p.ordered_dict().op('(').str("w").tensor("0", 4).op('u').op('.');
  const std::string path = dir.str("storage.pt");
  write_bytes(path, torch_save_zip(p.bytes, {{"data/0", floats({1, 2, 3, 4})}}));
  CHECK(torch::equal(read_weights(path).at(0).second, torch::tensor({1.0f, 2.0f, 3.0f, 4.0f})));
  for (const bool compress : {false, true}) {
    CAPTURE(compress);
    write_bytes(path, torch_save_zip(p.bytes, {{"data/0", std::string(64 << 20, '\0')}}, compress));
    CHECK(contains(error_of([&] { read_weights(path); }),
                   "storage '0' of 4 elements in 67108864 bytes"));
  }
  // Deflated to its size, it reads as stored.
  write_bytes(path, torch_save_zip(p.bytes, {{"data/0", floats({1, 2, 3, 4})}}, true));
  CHECK(torch::equal(read_weights(path).at(0).second, torch::tensor({1.0f, 2.0f, 3.0f, 4.0f})));
  // A damaged byte of a storage fails its CRC.
  std::string bytes = torch_save_zip(p.bytes, {{"data/0", floats({1, 2, 3, 4})}});
  const std::size_t at = bytes.find(floats({1, 2, 3, 4}));
  REQUIRE(at != std::string::npos);
  bytes[at] ^= 1;
  write_bytes(path, bytes);
  CHECK(contains(error_of([&] { read_weights(path); }), "entry 'archive/data/0' fails its CRC check"));
}

// As the safetensors library reads a file: each name once, and the tensors' bytes cover the
// data exactly (no overlap, no hole, nothing after); a 4 GiB hole after a good file is refused
// without being read.
TEST_CASE("Train.Weights.SafetensorsOffsetsCoverTheDataExactly" * doctest::timeout(120)) {
  TempDir dir("weights-cover");
  const auto file = [](const std::string& header, std::size_t data) {
    std::string padded = header + std::string((8 - header.size() % 8) % 8, ' ');
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((padded.size() >> (8 * i)) & 0xff);
    return out + padded + std::string(data, '\0');
  };
  const auto refusal = [&](const std::string& bytes) {
    const std::string path = dir.str("bad.safetensors");
    write_bytes(path, bytes);
    return error_of([&] { read_weights(path); });
  };
  const std::string a = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  CHECK(contains(refusal(file("{" + a + R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8)),
                 "tensor 'b': data_offsets [4, 8] overlap another tensor's"));
  CHECK(contains(refusal(file("{" + a + R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})", 16)),
                 "tensor 'b': data_offsets [12, 16] leave a hole after byte 8"));
  CHECK(contains(refusal(file("{" + a + "}", 12)), "the tensors cover 8 of its 12 bytes of data"));
  CHECK(contains(refusal(file("{" + a + "," + a + "}", 8)), "tensor 'a': named twice in the header"));
  // What the JSON reader refuses, and where.
  CHECK(contains(refusal(file(R"({"a":{"dtype":"F32",shape":[2]}})", 8)),
                 "bad.safetensors: damaged safetensors header (syntax error while parsing object "
                 "key"));
  CHECK(contains(refusal(file(R"({"a":{"dtype":"F32",shape":[2]}})", 8)), ", at byte 28)"));
  CHECK(contains(refusal(file(R"({"__metadata__":{"x":[[[[[[[[[1]]]]]]]]]}})", 0)),
                 "damaged safetensors header (nesting too deep)"));
  CHECK(contains(refusal(file(R"({"a":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,8]}})", 8)),
                 "tensor 'a': a shape larger than the file"));
  CHECK(contains(refusal(file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8.0]}})", 8)),
                 "tensor 'a': data_offsets that are not whole numbers >= 0"));
  CHECK(contains(refusal(file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8)),
                 "tensor 'a': a shape entry that is not a whole number >= 0"));
  // The tensors come in the file's order, not sorted by name.
  const std::string ordered = dir.str("ordered.safetensors");
  write_bytes(ordered, file(R"({"z":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                            R"("__metadata__":{"format":"pt"},)"
                            R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                            8));
  const StateDict read = read_weights(ordered);
  REQUIRE(read.size() == 2);
  CHECK(read[0].first == "z");
  CHECK(read[1].first == "a");
  // A good file followed by a 4 GiB hole (sparse: it takes no disk).
  const std::string path = dir.str("hole.safetensors");
  write_bytes(path, file("{" + a + "}", 8));
  fs::resize_file(path, fs::file_size(path) + (std::uint64_t{4} << 30));
  CHECK(contains(error_of([&] { read_weights(path); }),
                 "the tensors cover 8 of its 4294967304 bytes of data"));
}
