#include <doctest/doctest.h>

#include <set>
#include <string>
#include <tuple>

#include "graph/error.hpp"
#include "stages/train/partitioned/schedule.hpp"

using namespace flowtrain;
using namespace flowtrain::train;

namespace {
using Kind = PartitionScheduleKind;
}  // namespace

// The schedules of torch.distributed.pipelining, action by action, on 2 ranks and 4
// micro-batches.
TEST_CASE("Train.PartitionSchedule.ActionsAsTorchPipeliningOrdersThem") {
  const PartitionSchedule gpipe = make_partition_schedule(Kind::kGPipe, 2, 4);
  CHECK(describe_actions(gpipe, 0) == "F0 F1 F2 F3 B0 B1 B2 B3");
  CHECK(describe_actions(gpipe, 1) == "F0 F1 F2 F3 B0 B1 B2 B3");
  const PartitionSchedule one = make_partition_schedule(Kind::k1F1B, 2, 4);
  CHECK(describe_actions(one, 0) == "F0 F1 B0 F2 B1 F3 B2 B3");
  CHECK(describe_actions(one, 1) == "F0 B0 F1 B1 F2 B2 F3 B3");
  // Two stages a rank (rank 0 holds stages 0 and 2, rank 1 stages 1 and 3), in Megatron's
  // interleaved order: a warm-up of forwards, then one forward and one backward in turn.
  const PartitionSchedule inter = make_partition_schedule(Kind::kInterleaved, 2, 4, 2);
  CHECK(inter.stages == 4);
  CHECK(describe_actions(inter, 0) ==
        "F0.0 F0.1 F2.0 F2.1 F0.2 B2.0 F0.3 B2.1 F2.2 B0.0 F2.3 B0.1 B2.2 B2.3 B0.2 B0.3");
  CHECK(describe_actions(inter, 1) ==
        "F1.0 F1.1 F3.0 B3.0 F3.1 B3.1 F1.2 B1.0 F1.3 B1.1 F3.2 B3.2 F3.3 B3.3 B1.2 B1.3");
}

// Every schedule runs each forward and backward once, on the rank holding its stage, and
// finishes (no rank waits for an action that never runs).
TEST_CASE("Train.PartitionSchedule.EveryActionOnceOnItsRankAndNoDeadlock") {
  for (const auto& [kind, chunks] :
       {std::tuple{Kind::kGPipe, 1}, std::tuple{Kind::k1F1B, 1}, std::tuple{Kind::kInterleaved, 2},
        std::tuple{Kind::kInterleaved, 3}}) {
    for (int ranks = 1; ranks <= 4; ++ranks) {
      for (int m = 1; m <= 12; ++m) {
        if (kind == Kind::kInterleaved && m % ranks != 0) continue;
        const std::string schedule_name = to_string(kind);
        CAPTURE(schedule_name);
        CAPTURE(ranks);
        CAPTURE(m);
        const PartitionSchedule s = make_partition_schedule(kind, ranks, m, chunks);
        std::set<std::tuple<bool, int, int>> seen;
        std::size_t actions = 0;
        for (int r = 0; r < ranks; ++r) {
          for (const PartitionAction& a : s.actions[static_cast<std::size_t>(r)]) {
            CHECK(s.rank_of(a.stage) == r);
            seen.insert({a.kind == PartitionAction::Kind::kForward, a.stage, a.microbatch});
            ++actions;
          }
        }
        CHECK(actions == static_cast<std::size_t>(2 * s.stages * m));
        CHECK(seen.size() == actions);
        CHECK_NOTHROW(simulate_pipeline(s));
      }
    }
  }
}

// GPipe and 1F1B idle (P - 1) / (M + P - 1) of the ranks' time; interleaving shrinks that, and
// 1F1B keeps at most P - rank micro-batches' activations where GPipe keeps all M.
TEST_CASE("Train.PartitionSchedule.BubbleAndActivationsAsTheTextbookSays") {
  for (int ranks = 2; ranks <= 4; ++ranks) {
    for (int m = ranks; m <= 4 * ranks; m += ranks) {
      CAPTURE(ranks);
      CAPTURE(m);
      const PartitionTimeline gpipe =
          simulate_pipeline(make_partition_schedule(Kind::kGPipe, ranks, m));
      const PartitionTimeline one =
          simulate_pipeline(make_partition_schedule(Kind::k1F1B, ranks, m));
      CHECK(gpipe.bubble == doctest::Approx(textbook_bubble(ranks, m)));
      CHECK(one.bubble == doctest::Approx(textbook_bubble(ranks, m)));
      CHECK(simulate_pipeline(make_partition_schedule(Kind::k1F1B, ranks, m), 1, 1).bubble ==
            doctest::Approx(textbook_bubble(ranks, m)));
      for (int stage = 0; stage < ranks; ++stage) {
        CHECK(gpipe.peak_in_flight[static_cast<std::size_t>(stage)] == m);
        CHECK(one.peak_in_flight[static_cast<std::size_t>(stage)] == std::min(ranks - stage, m));
      }
      if (m >= 2 * ranks) {
        const PartitionTimeline inter =
            simulate_pipeline(make_partition_schedule(Kind::kInterleaved, ranks, m, 2));
        CHECK(inter.bubble < one.bubble);
      }
    }
  }
}

TEST_CASE("Train.PartitionSchedule.ADeadlockNamesTheRankAndAction") {
  PartitionSchedule s = make_partition_schedule(Kind::kGPipe, 2, 1);
  // Rank 1 asks for the gradient of micro-batch 0 before running its forward.
  std::swap(s.actions[1][0], s.actions[1][1]);
  try {
    simulate_pipeline(s);
    FAIL("no deadlock found");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) ==
          "pipeline schedule gpipe deadlocks: waiting forever are rank 0 at its action 2 "
          "(backward of stage 0, micro-batch 0); rank 1 at its action 1 (backward of stage 1, "
          "micro-batch 0)");
  }
  CHECK_THROWS_WITH_AS(make_partition_schedule(Kind::kInterleaved, 2, 3, 2),
                       "the interleaved schedule needs micro-batches in multiples of the ranks (3 "
                       "micro-batches, 2 ranks)",
                       Error);
  CHECK_THROWS_WITH_AS(
      enum_value<Kind>("zb", "param 'partition_schedule'"),
      "param 'partition_schedule' must be one of gpipe, 1f1b, interleaved, got 'zb'", Error);
}
