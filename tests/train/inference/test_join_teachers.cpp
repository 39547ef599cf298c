#include <doctest/doctest.h>
#include <torch/torch.h>

#include <map>
#include <mutex>

#include "graph/error.hpp"
#include "graph/pipeline.hpp"
#include "stages/data/batch.hpp"
#include "stages/train/files/checkpoint.hpp"
#include "stages/train/inference/join_teachers.hpp"
#include "stages/train/inference/teacher_infer.hpp"
#include "stages/train/models/compute.hpp"
#include "stages/train/models/vit.hpp"
#include "tests/test_stages.hpp"
#include "tests/train/seen_batches.hpp"
#include "tests/train/training_fixture.hpp"

using namespace flowtrain;
using namespace flowtrain::train;
using namespace flowtrain::testing;

namespace {

// Random 32 px batches of 8 images; the same ones on every run.
class RandomBatches final : public Source<data::Batch> {
 public:
  explicit RandomBatches(int count) : count_(count) {}

 protected:
  std::optional<data::Batch> next() override {
    if (number_ == count_) return std::nullopt;
    torch::manual_seed(100 + number_);
    data::Batch batch;
    batch.number = static_cast<std::uint64_t>(number_++);
    batch.images = torch::rand({8, 3, 32, 32});
    batch.labels = torch::zeros({8}, torch::kLong);
    return batch;
  }

 private:
  int count_;
  int number_ = 0;
};

void write_teacher(const std::string& path, std::uint64_t seed, int dim) {
  torch::manual_seed(seed);
  ViT teacher(ModelConfig{
      .image_size = 32, .patch_size = 8, .dim = dim, .depth = 1, .heads = 2, .classes = 4});
  save_checkpoint(path, teacher, nullptr, {});
}

}  // namespace

TEST_CASE("Train.Ensemble.JoinAveragesTwoTeachersBuiltInCpp" * doctest::timeout(120)) {
  TempDir dir;
  write_teacher(dir / "a.pt", 1, 32);
  write_teacher(dir / "b.pt", 2, 48);

  // Each teacher alone, for reference.
  SeenBatches alone_a, alone_b;
  for (auto [model, seen] :
       {std::pair{dir / "a.pt", &alone_a}, std::pair{dir / "b.pt", &alone_b}}) {
    Pipeline p;
    p.add("batches", std::make_unique<RandomBatches>(6));
    p.add<TeacherInferStage>("teacher", {.inference = {.model = model}});
    p.add("sink", seen->sink());
    const RunReport report = p.run({.threads = 2});
    // Its results: images, time per batch, and the rate of its products (from the ViT's shape).
    std::map<std::string, double> results;
    for (const StageResult& r : report.stages[1].results) results[r.name] = r.value;
    std::int64_t images = 0;
    for (const auto& [number, batch] : seen->batches) images += batch.size();
    CHECK(results["images"] == static_cast<double>(images));
    CHECK(results["forward_ms"] > 0);
    CHECK(results["gflops"] > 0);
    // This CPU's rate for float32 products on the teacher's one intra-op thread: measured once.
    CHECK(results["matrix_rate_gflops"] > 0);
    CHECK(results["matrix_rate_gflops"] == matrix_rate_gflops(c10::kFloat, 1));
  }

  //              +-> teacher_a -+
  //   batches ---+              +-> join -> sink
  //              +-> teacher_b -+
  SeenBatches joined;
  Pipeline p;
  p.add("batches", std::make_unique<RandomBatches>(6));
  p.add<TeacherInferStage>("teacher_a", {.inference = {.model = dir / "a.pt"}},
                           {.queue_capacity = 2});
  p.add<TeacherInferStage>("teacher_b", {.inference = {.model = dir / "b.pt"}},
                           {.queue_capacity = 2, .inputs = {"batches"}});
  p.add<JoinTeachersStage>(
      "join", {}, {.concurrency = 2, .queue_capacity = 2, .inputs = {"teacher_a", "teacher_b"}});
  p.add("sink", joined.sink());
  const RunReport report = p.run({.threads = 2});
  CHECK(report.stages[3].items_in == 6);

  REQUIRE(joined.batches.size() == 6);
  for (std::uint64_t n = 0; n < 6; ++n) {
    const data::Batch& out = joined.batches[n];
    const at::Tensor a = alone_a.batches[n].teacher_logits;
    const at::Tensor b = alone_b.batches[n].teacher_logits;
    CHECK_FALSE(torch::equal(a, b));
    CHECK(torch::equal(out.teacher_logits, (a.clone().add_(b)).div_(2.0)));
    CHECK(torch::equal(out.images, alone_a.batches[n].images));
  }
}

TEST_CASE("Train.Ensemble.JoinRefusesMismatchedTeachers") {
  data::Batch a, b;
  a.images = b.images = torch::zeros({2, 3, 4, 4});
  a.teacher_logits = torch::zeros({2, 4});
  b.teacher_logits = torch::zeros({2, 5});
  // Through a pipeline, as a user meets it: the error names the join and the shapes.
  class One final : public Source<data::Batch> {
   public:
    explicit One(data::Batch x) : x_(std::move(x)) {}

   protected:
    std::optional<data::Batch> next() override {
      if (done_) return std::nullopt;
      done_ = true;
      return x_;
    }

   private:
    data::Batch x_;
    bool done_ = false;
  };
  Pipeline p;
  p.add("batches", std::make_unique<One>(a));
  p.add("same", std::make_unique<ProbeMap<data::Batch>>([](data::Batch&& x, ItemContext&) {
          return std::optional<data::Batch>(std::move(x));
        }));
  p.add("other", std::make_unique<ProbeMap<data::Batch>>([b](data::Batch&& x, ItemContext&) {
          x.teacher_logits = b.teacher_logits;
          return std::optional<data::Batch>(std::move(x));
        }),
        {.inputs = {"batches"}});
  p.add<JoinTeachersStage>("join", {}, {.inputs = {"same", "other"}});
  p.add("sink", std::make_unique<ProbeSink<data::Batch>>([](data::Batch&&, ItemContext&) {}));
  CHECK_THROWS_WITH_AS(p.run({.threads = 1}),
                       "stage 'join' failed on item 0: teacher logits of branch 2 have shape "
                       "[2, 5], branch 1's [2, 4]; the teachers must predict the same classes",
                       StageError);
}
