#include <doctest/doctest.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "graph/error.hpp"
#include "graph/params.hpp"
#include "stages/train/folder_lock.hpp"
#include "stages/train/train_step.hpp"
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
  Params params = Params::defaults(TrainStepStage::describe().params);
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, std::int64_t>>{{"classes", 4},
                                                         {"image_size", 32},
                                                         {"patch_size", 8},
                                                         {"dim", 32},
                                                         {"depth", 1},
                                                         {"heads", 2}}) {
    params.set(key, value);
  }
  params.set("checkpoint_dir", dir / "run");
  const TrainStepStage first(params);
  CHECK_THROWS_WITH_AS(
      TrainStepStage{params},
      doctest::Contains(
          ("checkpoint_dir " + (dir / "run") + " is in use by another run (pid ").c_str()),
      Error);
}

TEST_CASE("Train.FolderLock.UnopenableFileIsAClearError") {
  CHECK_THROWS_WITH_AS(FolderLock("/nonexistent/flowtrain", ".lock"),
                       doctest::Contains("cannot open lock file /nonexistent/flowtrain/.lock"),
                       Error);
}
