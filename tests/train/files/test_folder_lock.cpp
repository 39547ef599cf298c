#include <doctest/doctest.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <string>

#include "graph/error.hpp"
#include "stages/train/files/folder_lock.hpp"
#include "stages/train/step/train_step.hpp"
#include "tests/train/training_fixture.hpp"

using namespace flowtrain;
using namespace flowtrain::train;
using namespace flowtrain::testing;

TEST_CASE("Train.FolderLock.SecondClaimFailsNamingTheHolder") {
  TempDir dir("lock");
  auto first = std::make_unique<FolderLock>(dir.path(), ".lock");
  const std::string pid = std::to_string(::getpid());
  CHECK_THROWS_WITH_AS(FolderLock(dir.path(), ".lock"),
                       doctest::Contains(("is in use by another run (pid " + pid + ")").c_str()),
                       Error);
  // Another name (another rank's lock) is free; the first is free again once released.
  CHECK_NOTHROW(FolderLock(dir.path(), ".lock.rank1"));
  first.reset();
  CHECK_NOTHROW(FolderLock(dir.path(), ".lock"));
}

TEST_CASE("Train.FolderLock.TwoTrainingStagesCannotShareACheckpointDir") {
  // Two runs into one checkpoint_dir used to both "succeed", interleaving steps.csv.
  TempDir dir("lock-stage");
  const TrainStepStage::Options options{
      .checkpoint_dir = dir / "run",
      .model = {.image_size = 32, .classes = 4, .patch_size = 8, .dim = 32, .depth = 1, .heads = 2}};
  const TrainStepStage first(options);
  CHECK_THROWS_WITH_AS(
      TrainStepStage{options},
      doctest::Contains(
          ("checkpoint_dir " + (dir / "run") + " is in use by another run (pid ").c_str()),
      Error);
}

TEST_CASE("Train.FolderLock.UnopenableFileIsAClearError") {
  CHECK_THROWS_WITH_AS(FolderLock("/nonexistent/flowtrain", ".lock"),
                       doctest::Contains("cannot open lock file /nonexistent/flowtrain/.lock"),
                       Error);
}
