#include <doctest/doctest.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "graph/error.hpp"
#include "stages/train/files/torchscript.hpp"
#include "stages/train/models/vit.hpp"

using namespace flowtrain;
using namespace flowtrain::train;
namespace fs = std::filesystem;

namespace {

// A fresh folder under the system temp folder, removed with everything in it at scope exit.
class TempFolder {
 public:
  TempFolder() {
    std::string pattern = (fs::temp_directory_path() / "flowtrain-torchscript-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempFolder() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

ModelConfig small_config(int regression_outputs, double dropout = 0) {
  return ModelConfig{.image_size = 32,
                   .patch_size = 8,
                   .dim = 32,
                   .depth = 2,
                   .heads = 2,
                   .classes = 5,
                   .regression_outputs = regression_outputs,
                   .dropout = dropout};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

// The message of the flowtrain::Error `call` throws; fails the test if it throws nothing or
// something else.
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

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.rfind(prefix, 0) == 0;
}

void check_close(const torch::Tensor& actual, const torch::Tensor& expected) {
  REQUIRE(actual.defined());
  REQUIRE(actual.sizes() == expected.sizes());
  MESSAGE("max |difference| " << (actual - expected).abs().max().item<double>());
  CHECK(torch::allclose(actual, expected, /*rtol=*/1e-5, /*atol=*/1e-5));
}

// A TorchScript teacher written in TorchScript source, as someone's PyTorch model would be:
// a linear classifier on the flattened image, optionally returning (logits, regression).
torch::jit::Module linear_teacher(const torch::Tensor& weight,
                                  const torch::Tensor& bias,
                                  bool regression) {
  torch::jit::Module teacher(c10::QualifiedName("__torch__.LinearTeacher"));
  teacher.register_parameter("weight", weight, /*is_buffer=*/false);
  teacher.register_parameter("bias", bias, /*is_buffer=*/false);
  teacher.register_attribute("training", c10::BoolType::get(), true);
  teacher.define(regression ? R"(
def forward(self, images: Tensor) -> Tuple[Tensor, Tensor]:
    logits = torch.linear(images.flatten(1), self.weight, self.bias)
    return logits, logits.sum(1)
)"
                            : R"(
def forward(self, images: Tensor) -> Tensor:
    return torch.linear(images.flatten(1), self.weight, self.bias)
)");
  return teacher;
}

// A module whose forward returns `expression` (of `images`), saved to `path`.
void save_module_returning(const std::string& path,
                           const std::string& return_type,
                           const std::string& expression) {
  torch::jit::Module module(c10::QualifiedName("__torch__.Odd"));
  module.register_attribute("training", c10::BoolType::get(), false);
  module.define("def forward(self, images: Tensor) -> " + return_type + ":\n    return " +
                expression + "\n");
  module.save(path);
}

}  // namespace

TEST_CASE("TorchScript.Export.MatchesModel" * doctest::timeout(120)) {
  at::set_num_threads(1);
  TempFolder folder;
  for (const int regression_outputs : {0, 1}) {
    CAPTURE(regression_outputs);
    torch::manual_seed(regression_outputs);
    ModelConfig config = small_config(regression_outputs);
    config.regression_scale = 100;  // outputs in the targets' units, in the file as in C++
    ViT model(config);
    model->eval();
    const torch::Tensor images = torch::randn({3, 3, 32, 32});
    const ModelOutput expected = model(images);
    const std::string path = folder.file("vit" + std::to_string(regression_outputs) + ".pt");
    export_torchscript(model, path);
    CHECK_FALSE(fs::exists(path + ".tmp"));

    {  // through ScriptedModel
      const ScriptedModel scripted(path);
      CHECK(scripted.image_size() == 32);
      const ModelOutput out = scripted.forward(images);
      check_close(out.logits, expected.logits);
      CHECK(out.regression.defined() == (regression_outputs > 0));
      if (regression_outputs > 0) check_close(out.regression, expected.regression);
      // Only the class-token path differs per image: a batch of one gives the same row.
      check_close(scripted(images.narrow(0, 1, 1)).logits, expected.logits.narrow(0, 1, 1));
    }
    {  // through plain torch::jit::load, with timm's parameter names

      torch::jit::Module loaded = torch::jit::load(path);
      loaded.eval();
      const c10::IValue out = loaded.forward({images});
      if (regression_outputs > 0) {
        REQUIRE(out.isTuple());
        check_close(out.toTupleRef().elements()[0].toTensor(), expected.logits);
        check_close(out.toTupleRef().elements()[1].toTensor(), expected.regression);
      } else {
        REQUIRE(out.isTensor());
        check_close(out.toTensor(), expected.logits);
      }
      std::set<std::string> names, expected_names;
      for (const auto& p : loaded.named_parameters()) {
        names.insert(p.name);
        CHECK(torch::equal(p.value, model->named_parameters()[p.name]));
      }
      for (const auto& p : model->named_parameters()) expected_names.insert(p.key());
      CHECK(names == expected_names);
      CHECK(names.count("blocks.1.attn.qkv.weight") == 1);
      CHECK(names.count("patch_embed.proj.weight") == 1);
      CHECK(loaded.attr("classes").toInt() == 5);
    }
    {  // a wrong image size is refused with the expected shape

      const ScriptedModel scripted(path);
      const std::string error = error_of([&] { scripted.forward(torch::zeros({1, 3, 16, 16})); });
      CHECK(error == path +
                         ": forward failed: AssertionError: ViT: expected images [B, 3, 32, 32], "
                         "got [1, 3, 16, 16]");
    }
  }
}

TEST_CASE("TorchScript.Export.EvalSemanticsOfTrainingModel" * doctest::timeout(120)) {
  at::set_num_threads(1);
  TempFolder folder;
  torch::manual_seed(7);
  ViT model(small_config(2, /*dropout=*/0.3));
  model->train();
  const std::string path = folder.file("dropout.pt");
  export_torchscript(model, path);
  // Overwriting an existing file replaces it.
  export_torchscript(model, path);
  CHECK(model->is_training());

  const torch::Tensor images = torch::randn({2, 3, 32, 32});
  model->eval();
  const ModelOutput expected = model(images);
  const ScriptedModel scripted(path);
  const ModelOutput first = scripted.forward(images);
  check_close(first.logits, expected.logits);
  check_close(first.regression, expected.regression);
  // No dropout: two runs agree exactly.
  CHECK(torch::equal(scripted.forward(images).logits, first.logits));
}

TEST_CASE("TorchScript.Export.UnwritableFolderNamesPath" * doctest::timeout(120)) {
  TempFolder folder;
  ViT model(small_config(0));
  const std::string path = folder.file("missing/vit.pt");
  CHECK(error_of([&] { export_torchscript(model, path); }) ==
        "cannot write " + path + ": cannot create " + path + ".tmp (No such file or directory)");
  CHECK_FALSE(fs::exists(path + ".tmp"));
}

TEST_CASE("TorchScript.Load.TeacherFromSourceRuns" * doctest::timeout(120)) {
  at::set_num_threads(1);
  TempFolder folder;
  torch::manual_seed(3);
  const torch::Tensor weight = torch::randn({4, 12});
  const torch::Tensor bias = torch::randn({4});
  const torch::Tensor images = torch::randn({5, 3, 2, 2});
  const torch::Tensor expected = torch::linear(images.flatten(1), weight, bias);

  SUBCASE("returning logits") {
    const std::string path = folder.file("teacher.pt");
    linear_teacher(weight, bias, /*regression=*/false).save(path);
    const ScriptedModel teacher(path);
    CHECK_FALSE(teacher.image_size().has_value());
    const ModelOutput out = teacher.forward(images);
    check_close(out.logits, expected);
    CHECK_FALSE(out.regression.defined());
    CHECK_FALSE(out.logits.requires_grad());
  }
  SUBCASE("returning (logits, regression [B])") {
    const std::string path = folder.file("teacher_regression.pt");
    linear_teacher(weight, bias, /*regression=*/true).save(path);
    const ModelOutput out = ScriptedModel(path).forward(images);
    check_close(out.logits, expected);
    // A [B] regression becomes [B, 1].
    check_close(out.regression, expected.sum(1, /*keepdim=*/true));
  }
  SUBCASE("returning a list [logits, regression]") {
    const std::string path = folder.file("teacher_list.pt");
    save_module_returning(path, "List[Tensor]", "[images.flatten(1), images.flatten(1)[:, :2]]");
    const ModelOutput out = ScriptedModel(path).forward(images);
    CHECK(out.logits.sizes() == torch::IntArrayRef({5, 12}));
    CHECK(out.regression.sizes() == torch::IntArrayRef({5, 2}));
  }
  SUBCASE("without a training attribute (nothing to switch to eval)") {
    const std::string path = folder.file("no_training.pt");
    torch::jit::Module module(c10::QualifiedName("__torch__.Bare"));
    module.define("def forward(self, images: Tensor) -> Tensor:\n    return images.flatten(1)\n");
    module.save(path);
    CHECK(ScriptedModel(path).forward(images).logits.sizes() == torch::IntArrayRef({5, 12}));
  }
}

TEST_CASE("TorchScript.Load.ConcurrentForward" * doctest::timeout(120)) {
  at::set_num_threads(1);
  TempFolder folder;
  torch::manual_seed(11);
  ViT model(small_config(1));
  model->eval();
  const std::string path = folder.file("vit.pt");
  export_torchscript(model, path);
  const ScriptedModel scripted(path);
  const torch::Tensor images = torch::randn({2, 3, 32, 32});
  const torch::Tensor expected = scripted.forward(images).logits;

  constexpr int kThreads = 4;
  std::vector<torch::Tensor> results(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) results[t] = scripted.forward(images).logits;
    });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& result : results) CHECK(torch::equal(result, expected));
}

TEST_CASE("TorchScript.Load.ErrorsAreOneLine" * doctest::timeout(120)) {
  TempFolder folder;
  const auto check_one_line = [](const std::string& error) {
    CHECK(error.find('\n') == std::string::npos);
  };

  SUBCASE("missing file") {
    const std::string path = folder.file("missing.pt");
    CHECK(error_of([&] { ScriptedModel model(path); }) == path + ": no such file");
  }
  SUBCASE("a JPEG renamed .pt") {
    const std::string path = folder.file("photo.pt");
    write_bytes(path, std::string("\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01", 16) +
                          std::string(200, '\x42') + "\xff\xd9");
    const std::string error = error_of([&] { ScriptedModel model(path); });
    MESSAGE(error);
    CHECK(starts_with(error, path + ": not a TorchScript model ("));
    CHECK(error.back() == ')');
    check_one_line(error);
  }
  SUBCASE("a text file renamed .pt") {
    const std::string path = folder.file("notes.pt");
    write_bytes(path, "these are not weights\n");
    const std::string error = error_of([&] { ScriptedModel model(path); });
    MESSAGE(error);
    CHECK(starts_with(error, path + ": not a TorchScript model ("));
    check_one_line(error);
  }
  SUBCASE("a module with no forward method") {
    const std::string path = folder.file("no_forward.pt");
    torch::jit::Module module(c10::QualifiedName("__torch__.NoForward"));
    module.register_attribute("training", c10::BoolType::get(), false);
    module.define("def predict(self, x: Tensor) -> Tensor:\n    return x\n");
    module.save(path);
    CHECK(error_of([&] { ScriptedModel model(path); }) ==
          path + ": the module has no forward method");
  }
  SUBCASE("forward returns the wrong type or shape") {
    const std::string expected_tail =
        ", expected a Tensor of logits [B, classes], a tuple (logits, regression) or a dict "
        "with 'logits' (and optionally 'distillation', 'regression')";
    const torch::Tensor images = torch::zeros({2, 3, 4, 4});
    struct Case {
      std::string return_type, expression, described;
    };
    const Case cases[] = {
        {"int", "images.size(0)", "int"},
        {"Tensor", "images", "Tensor[2, 3, 4, 4]"},
        {"Tensor", "images.flatten(1)[0]", "Tensor[48]"},
        {"Tensor", "images.flatten(1).long()", "Tensor[2, 48] of Long"},
        {"Tensor", "images.flatten(1)[:1]", "Tensor[1, 48]"},  // not one row per image
        {"Tuple[Tensor, Tensor, Tensor]", "(images, images, images)",
         "Tuple[Tensor[2, 3, 4, 4], Tensor[2, 3, 4, 4], Tensor[2, 3, 4, 4]]"},
        {"Dict[str, Tensor]", "{'regression': images[:, 0, 0, 0]}", "Dict[str, Tensor]"},
    };
    int i = 0;
    for (const Case& c : cases) {
      CAPTURE(c.expression);
      const std::string path = folder.file("odd" + std::to_string(i++) + ".pt");
      save_module_returning(path, c.return_type, c.expression);
      const ScriptedModel model(path);
      CHECK(error_of([&] { model.forward(images); }) ==
            path + ": forward returned " + c.described + expected_tail);
    }
    const std::string path = folder.file("odd_dict.pt");
    save_module_returning(path, "Dict[str, Tensor]", "{'logits': images}");
    CHECK(error_of([&] { ScriptedModel(path).forward(images); }) ==
          path + ": forward returned a dict whose 'logits' is Tensor[2, 3, 4, 4], expected "
                 "'logits' [B, classes] and optionally 'distillation' [B, classes] and "
                 "'regression' [B, outputs]");
  }
  SUBCASE("a dict of outputs: logits, a distillation head, a [B] regression") {
    const std::string path = folder.file("dict.pt");
    save_module_returning(path, "Dict[str, Tensor]",
                          "{'logits': images.flatten(1), 'distillation': images.flatten(1) * 2.0, "
                          "'regression': images[:, 0, 0, 0]}");
    const torch::Tensor images = torch::rand({2, 3, 4, 4});
    const ModelOutput out = ScriptedModel(path).forward(images);
    CHECK(torch::equal(out.logits, images.flatten(1)));
    CHECK(torch::equal(out.distillation, images.flatten(1) * 2.0));
    CHECK(torch::equal(out.regression, images.index({torch::indexing::Slice(), 0, 0, 0}).unsqueeze(1)));
  }
}

// Not a check of its own: writes the model and labels the flowtrain-predict command-line tests
// use, into $FLOWTRAIN_PREDICT_FIXTURE (tests/CMakeLists.txt runs it as a ctest fixture).
// Without the variable it writes to a temporary folder and checks the model loads.
TEST_CASE("TorchScript.Fixture.PredictModel" * doctest::timeout(120)) {
  const char* target = std::getenv("FLOWTRAIN_PREDICT_FIXTURE");
  TempFolder scratch;
  const fs::path folder = target != nullptr ? fs::path(target) : scratch.path();
  fs::create_directories(folder);
  torch::manual_seed(0);
  ViT model(small_config(1));
  export_torchscript(model, (folder / "vit.pt").string());
  std::ofstream labels(folder / "labels.txt");
  for (const char* label : {"apple", "bread", "cheese", "dates", "eggs"}) labels << label << "\n";
  labels.close();
  CHECK(ScriptedModel((folder / "vit.pt").string()).image_size() == 32);
  // A TorchScript file that is not an image model, for the CLIs' error tests.
  torch::jit::Module text(c10::QualifiedName("__torch__.NotAModel"));
  text.register_attribute("training", c10::BoolType::get(), false);
  text.define("def forward(self, images: Tensor) -> str:\n    return 'not logits'\n");
  text.save((folder / "not_a_model.pt").string());
}

TEST_CASE("TorchScript.Export.ResNetAndDeiTMatchModel" * doctest::timeout(120)) {
  at::set_num_threads(1);
  TempFolder folder;
  ModelConfig deit = small_config(1);
  deit.distillation_token = true;
  deit.drop_path = 0.2;
  const ModelConfig resnets[] = {
      {.arch = "resnet", .image_size = 32, .dim = 8, .classes = 5, .regression_outputs = 1,
       .regression_scale = 100, .stage_blocks = {1, 2}, .stem = "compact"},
      {.arch = "resnet", .image_size = 32, .dim = 8, .classes = 5, .stage_blocks = {2, 1, 1}}};
  for (const ModelConfig& config : {deit, resnets[0], resnets[1]}) {
    CAPTURE(config.describe());
    torch::manual_seed(4);
    ImageModel model = make_model(config);
    // A few training forwards, so that BatchNorm's running statistics are not the defaults.
    model->train();
    for (int i = 0; i < 3; ++i) model->forward(torch::randn({8, 3, 32, 32}) * (i + 1));
    model->eval();
    const torch::Tensor images = torch::randn({3, 3, 32, 32});
    const ModelOutput expected = model->forward(images);
    const std::string path = folder.file("model.pt");
    export_torchscript(model, path);
    const ScriptedModel scripted(path);
    const ModelOutput out = scripted.forward(images);
    // Op for op the same computation: bit for bit the same outputs.
    CHECK(torch::equal(out.logits, expected.logits));
    CHECK(out.regression.defined() == expected.regression.defined());
    if (expected.regression.defined()) CHECK(torch::equal(out.regression, expected.regression));
    torch::jit::Module loaded = torch::jit::load(path);
    std::set<std::string> names, expected_names;
    for (const auto& p : loaded.named_parameters()) names.insert(p.name);
    for (const auto& p : loaded.named_buffers()) names.insert(p.name);
    for (const auto& p : model->named_parameters()) expected_names.insert(p.key());
    for (const auto& p : model->named_buffers()) expected_names.insert(p.key());
    CHECK(names == expected_names);
    const std::string error = error_of([&] { scripted.forward(torch::zeros({1, 3, 16, 16})); });
    CHECK(error == path + ": forward failed: AssertionError: " +
                       (config.is_vit() ? "ViT" : "ResNet") +
                       ": expected images [B, 3, 32, 32], got [1, 3, 16, 16]");
  }
}
