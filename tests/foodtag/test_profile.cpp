#include <doctest/doctest.h>

#include "apps/foodtag/profile.hpp"

namespace {

flowtrain::Progress training_progress(double elapsed_s, double step, double images) {
  flowtrain::Progress p;
  p.elapsed_s = elapsed_s;
  p.completed = static_cast<std::uint64_t>(step);
  p.expected = 100;
  p.stages = {
      {"source", 0.01, {}},
      {"augment", 0.42, {}},
      {"teacher_infer", 0.97, {}},
      {"student_step",
       0.60,
       {{"step", step}, {"total_steps", 100}, {"epoch", 3}, {"loss", 0.8421}, {"images", images}}}};
  return p;
}

}  // namespace

TEST_CASE("Foodtag.Progress.LineShowsEpochStepRateEtaLossAndBottleneck") {
  foodtag::ProgressLine line("distill", 40);
  CHECK(
      line.next(training_progress(10, 20, 1280)) ==
      "distill  epoch 3/40  step 20/100  128.0 img/s  ETA 40s  loss 0.842  teacher_infer busy 97%");
  // The rate is measured since the previous line; the ETA from the average since the start.
  CHECK(
      line.next(training_progress(20, 30, 1920)) ==
      "distill  epoch 3/40  step 30/100  64.0 img/s  ETA 47s  loss 0.842  teacher_infer busy 97%");
}

TEST_CASE("Foodtag.Progress.LineShowsTheTeacherCacheHitRate") {
  flowtrain::Progress p = training_progress(10, 20, 1280);
  p.stages.insert(p.stages.begin() + 2, {"teacher_cache", 0.02, {{"hits", 960}, {"misses", 320}}});
  foodtag::ProgressLine line("distill", 40);
  CHECK(line.next(p) ==
        "distill  epoch 3/40  step 20/100  128.0 img/s  ETA 40s  loss 0.842  "
        "cache 75% hits  teacher_infer busy 97%");
}

TEST_CASE("Foodtag.Progress.LineWithoutTrainingStageCountsBatches") {
  flowtrain::Progress p;
  p.elapsed_s = 4;
  p.completed = 2;
  p.expected = 6;
  p.stages = {{"source", 0.1, {}}, {"evaluate", 0.9, {}}};
  foodtag::ProgressLine line("student_eval", 0);
  CHECK(line.next(p) == "student_eval  batch 2/6  ETA 8s  evaluate busy 90%");
}

TEST_CASE("Foodtag.Progress.DurationText") {
  CHECK(foodtag::duration_text(45.4) == "45s");
  CHECK(foodtag::duration_text(192) == "3m12s");
  CHECK(foodtag::duration_text(3720) == "1h02m");
  CHECK(foodtag::duration_text(-3) == "0s");
}

TEST_CASE("Foodtag.Profile.StepSplitFromTheTrainingStage") {
  flowtrain::RunReport report;
  report.wall_s = 10;
  flowtrain::StageReport teacher;
  teacher.name = "teacher_infer";
  teacher.workers = 2;
  teacher.items_in = 10;
  teacher.busy_s = 9.68;
  flowtrain::StageReport student;
  student.name = "student_step";
  student.items_in = 10;
  student.results = {{"data_wait_ms", 35},
                     {"forward_ms", 208},
                     {"backward_ms", 399},
                     {"optimizer_ms", 8},
                     {"images", 640}};
  report.stages = {flowtrain::StageReport{}, teacher, student};
  CHECK(foodtag::step_split(report) ==
        "per step: data wait 35 ms, forward 208 ms, backward 399 ms, sync 0 ms, optimizer 8 ms "
        "(650 ms, 64.0 images/s); teacher 968 ms per batch on each of 2 workers, ahead of the "
        "student");
  // With the models' achieved GFLOP/s (teacher_infer and train_step report them).
  report.stages[1].results = {{"gflops", 73.6}};
  report.stages[2].results.push_back({"gflops", 61.2});
  CHECK(foodtag::step_split(report) ==
        "per step: data wait 35 ms, forward 208 ms, backward 399 ms, sync 0 ms, optimizer 8 ms "
        "(650 ms, 64.0 images/s); student_step 61 GFLOP/s; teacher 968 ms per batch on each of 2 "
        "workers, ahead of the student, 74 GFLOP/s");
  report.stages.pop_back();
  CHECK(foodtag::step_split(report).empty());
}

TEST_CASE("Foodtag.Profile.CacheSummaryFromTheCacheResults") {
  flowtrain::RunReport report;
  CHECK(foodtag::cache_summary(report).empty());
  flowtrain::StageReport cache;
  cache.name = "teacher_cache";
  cache.results = {{"hits", 43000},    {"misses", 0},        {"hit_rate", 100},
                   {"entries", 43000}, {"disk_mb", 2.51029}, {"bytes_per_view", 58.3789},
                   {"saved_s", 181.7}};
  report.stages = {cache};
  CHECK(foodtag::cache_summary(report) ==
        "teacher cache: 43000 hits, 0 misses (100% hits); 43000 views stored, 2.51 MB (58.4 "
        "bytes a view); teacher time saved 3m02s");
}
