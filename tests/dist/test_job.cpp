#include <doctest/doctest.h>
#include <stdlib.h>

#include "distributed/job.hpp"
#include "graph/error.hpp"

using namespace flowtrain;

namespace {
// Sets environment variables for a scope and removes every launcher variable after it.
struct Env {
  Env(std::initializer_list<std::pair<const char*, const char*>> vars) {
    clear();
    for (const auto& [k, v] : vars) ::setenv(k, v, 1);
  }
  ~Env() { clear(); }
  static void clear() {
    for (const char* k : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                          "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_NODELIST",
                          "SLURM_NODELIST", "SLURM_NODEID", "SLURM_STEP_TASKS_PER_NODE",
                          "SLURM_TASKS_PER_NODE", "SLURM_CPUS_PER_TASK", "LOCAL_WORLD_SIZE",
                          "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT"}) {
      ::unsetenv(k);
    }
  }
};
}  // namespace

TEST_CASE("Job.Placement.SingleProcessWithoutLauncher") {
  Env env({});
  const JobPlacement p = job_placement_from_env();
  CHECK(p.rank == 0);
  CHECK(p.world_size == 1);
  CHECK_FALSE(p.distributed());
  CHECK(p.launcher.empty());
}

TEST_CASE("Job.Placement.Torchrun") {
  Env env({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "node7"},
           {"MASTER_PORT", "29500"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "9"}});
  const JobPlacement p = job_placement_from_env();
  CHECK(p.launcher == "torchrun");  // wins over Slurm's variables
  CHECK(p.rank == 3);
  CHECK(p.world_size == 4);
  CHECK(p.local_rank == 1);
  CHECK(p.master_addr == "node7");
  CHECK(p.master_port == 29500);
  CHECK_FALSE(p.agent_store);
  CHECK(p.restart == 0);
}

// torchrun's agent hosts the store and counts its restarts of the group (--max_restarts).
TEST_CASE("Job.Placement.TorchrunAgentAndRestart") {
  Env env({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"},
           {"TORCHELASTIC_RESTART_COUNT", "2"}});
  const JobPlacement p = job_placement_from_env();
  CHECK(p.agent_store);
  CHECK(p.restart == 2);
  ::setenv("TORCHELASTIC_RESTART_COUNT", "-1", 1);
  CHECK_THROWS_WITH(job_placement_from_env(),
                    doctest::Contains("TORCHELASTIC_RESTART_COUNT"));
}

TEST_CASE("Job.Placement.Slurm") {
  Env env({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"},
           {"SLURM_JOB_NODELIST", "gpu[03-06,09],cpu1"}});
  const JobPlacement p = job_placement_from_env();
  CHECK(p.launcher == "slurm");
  CHECK(p.rank == 5);
  CHECK(p.world_size == 8);
  CHECK(p.local_rank == 1);
  CHECK(p.master_addr == "gpu03");
  CHECK(p.master_port == 0);
}

TEST_CASE("Job.Placement.BadValuesNameTheVariable") {
  {
    Env env({{"RANK", "4"}, {"WORLD_SIZE", "4"}});
    CHECK_THROWS_WITH_AS(job_placement_from_env(), "RANK=4 must be below WORLD_SIZE=4", Error);
  }
  {
    Env env({{"RANK", "0"}, {"WORLD_SIZE", "two"}});
    CHECK_THROWS_WITH_AS(job_placement_from_env(),
                         "environment variable WORLD_SIZE='two' is not a whole number >= 1",
                         Error);
  }
}

TEST_CASE("Job.SlurmNodeList.FirstHost") {
  CHECK(first_slurm_host("node01") == "node01");
  CHECK(first_slurm_host("a,b") == "a");
  CHECK(first_slurm_host("gpu[01-04],cpu7") == "gpu01");
  CHECK(first_slurm_host("rack2-n[007,009-011]") == "rack2-n007");
}

// srun's tasks on one node share its cores as torchrun's ranks do: this node's entry of the
// step's tasks per node, and the CPUs Slurm grants each task where it says.
TEST_CASE("Job.Placement.SlurmTasksOnThisNodeAndTheirCpus") {
  {
    Env env({{"SLURM_PROCID", "1"},
             {"SLURM_NTASKS", "2"},
             {"SLURM_LOCALID", "1"},
             {"SLURM_STEP_TASKS_PER_NODE", "2"},
             {"SLURM_TASKS_PER_NODE", "4"}});
    const JobPlacement p = job_placement_from_env();
    CHECK(p.local_world_size == 2);  // the step's, not the job's
    CHECK(p.cpus_per_rank == 0);
  }
  {
    Env env({{"SLURM_PROCID", "6"},
             {"SLURM_NTASKS", "7"},
             {"SLURM_NODEID", "3"},
             {"SLURM_TASKS_PER_NODE", "2(x3),1"},
             {"SLURM_CPUS_PER_TASK", "16"}});
    const JobPlacement p = job_placement_from_env();
    CHECK(p.local_world_size == 1);
    CHECK(p.cpus_per_rank == 16);
  }
  CHECK(slurm_tasks_on_node("2(x3),1", 2, "V") == 2);
  CHECK(slurm_tasks_on_node("3,2", 1, "V") == 2);
  CHECK_THROWS_WITH_AS(slurm_tasks_on_node("2(x3),1", 4, "V"),
                       "environment variable V='2(x3),1' lists 4 nodes, but this is node 4 "
                       "(SLURM_NODEID)",
                       Error);
  CHECK_THROWS_WITH_AS(slurm_tasks_on_node("2(x3", 0, "V"),
                       "environment variable V='2(x3' has an entry '2(x3' that is not N or N(xK)",
                       Error);
}
