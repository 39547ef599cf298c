#pragma once

#include <optional>
#include <string>

#include "graph/build_context.hpp"

namespace flowtrain {

/// Where this process stands in a data-parallel job, as its launcher told it through the
/// environment. Read by the dataset sources (to shard by rank) and the process-group set-up.
struct JobPlacement {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;       // rank on this machine
  /// Ranks on this machine sharing its cores: LOCAL_WORLD_SIZE, which torchrun and --nproc set;
  /// under Slurm, this node's entry of SLURM_STEP_TASKS_PER_NODE ("2(x3),1").
  int local_world_size = 1;
  /// The CPUs the launcher grants each rank (Slurm's --cpus-per-task: SLURM_CPUS_PER_TASK);
  /// 0 where it does not say, and the ranks on a machine share its cores.
  int cpus_per_rank = 0;
  std::string master_addr;  // rendezvous host (rank 0's)
  int master_port = 0;      // rendezvous port (0: not given)
  std::string launcher;     // "torchrun", "slurm", or "" for a single process
  /// torchrun's agent already hosts a store at MASTER_ADDR:MASTER_PORT
  /// (TORCHELASTIC_USE_AGENT_STORE=True): rank 0 connects to it instead of hosting one.
  bool agent_store = false;
  /// torchrun's restarts of this group so far (TORCHELASTIC_RESTART_COUNT under
  /// `--max_restarts`): each attempt keeps its keys in the agent's store apart, as PyTorch's
  /// workers do (`/worker/attempt_N/`).
  int restart = 0;

  bool distributed() const { return world_size > 1; }
};

/// Reads the launcher's environment:
///  - torchrun / flowtrain --nproc: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
///    MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE, TORCHELASTIC_RESTART_COUNT;
///  - Slurm (srun): SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, this node's tasks
///    (SLURM_STEP_TASKS_PER_NODE or SLURM_TASKS_PER_NODE at SLURM_NODEID), SLURM_CPUS_PER_TASK,
///    the first host of SLURM_JOB_NODELIST ("node[03-05,07]" -> "node03"), MASTER_PORT if set;
///  - neither: a single process (rank 0 of 1).
/// torchrun's variables win when both are set. Throws Error naming the variable on a malformed
/// or inconsistent value (RANK >= WORLD_SIZE, a non-number).
JobPlacement job_placement_from_env();

/// The placement the runner hands the stages it builds (BuildContext::provide, run_phases), or
/// a single process's where none was handed (a graph built from C++ alone): stages never read
/// the launcher's environment themselves.
const JobPlacement& job_placement(const BuildContext& context);

/// A job's ranks in groups of `ranks_per_shard` consecutive ranks that read the same samples
/// (a pipeline's): this rank's group, how many groups, and its place in its group. Throws Error
/// naming the param when ranks_per_shard does not divide the job's ranks.
struct ShardGroup {
  int index = 0;
  int count = 1;
  int member = 0;
};
ShardGroup shard_group(const JobPlacement& job, int ranks_per_shard);

/// The tasks on node `node` of a Slurm tasks-per-node list: "2(x3),1" gives 2 for nodes 0-2
/// and 1 for node 3. Throws Error naming `variable` if the list is malformed or too short.
int slurm_tasks_on_node(const std::string& list, int node, const std::string& variable);

/// The first host name of a Slurm node list: "gpu[01-04],cpu7" -> "gpu01", "a,b" -> "a".
std::string first_slurm_host(const std::string& nodelist);

}  // namespace flowtrain
