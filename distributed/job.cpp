#include "distributed/job.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "graph/error.hpp"

namespace flowtrain {

namespace {

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

int env_int(const char* name, int fallback, int min) {
  const std::optional<std::string> text = env(name);
  if (!text) return fallback;
  std::size_t used = 0;
  int value = 0;
  try {
    value = std::stoi(*text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text->size() || value < min) {
    throw Error(std::string("environment variable ") + name + "='" + *text +
                "' is not a whole number >= " + std::to_string(min));
  }
  return value;
}

}  // namespace

std::string first_slurm_host(const std::string& nodelist) {
  // The first entry ends at a comma outside brackets.
  std::size_t end = 0;
  int depth = 0;
  for (; end < nodelist.size(); ++end) {
    if (nodelist[end] == '[') ++depth;
    if (nodelist[end] == ']') --depth;
    if (nodelist[end] == ',' && depth == 0) break;
  }
  const std::string first = nodelist.substr(0, end);
  const std::size_t open = first.find('[');
  if (open == std::string::npos) return first;
  // "prefix[03-05,07]": the first number of the range list, zero padding kept.
  const std::string ranges = first.substr(open + 1);
  const std::size_t stop = ranges.find_first_of("-,]");
  return first.substr(0, open) + ranges.substr(0, stop);
}

int slurm_tasks_on_node(const std::string& list, int node, const std::string& variable) {
  const auto malformed = [&](const std::string& why) {
    return Error("environment variable " + variable + "='" + list + "' " + why);
  };
  int first = 0;  // the first node the entry describes
  std::size_t at = 0;
  while (at < list.size()) {
    const std::size_t comma = std::min(list.find(',', at), list.size());
    const std::string entry = list.substr(at, comma - at);
    // "N" or "N(xK)": N tasks on each of K nodes.
    int tasks = 0, nodes = 1;
    char close = 0;
    char extra = 0;
    const int read = std::sscanf(entry.c_str(), "%d(x%d%c%c", &tasks, &nodes, &close, &extra);
    const bool plain = read == 1 && entry.find('(') == std::string::npos;
    if (!(plain || (read == 3 && close == ')')) || tasks < 1 || nodes < 1) {
      throw malformed("has an entry '" + entry + "' that is not N or N(xK)");
    }
    if (node < first + nodes) return tasks;
    first += nodes;
    at = comma + 1;
  }
  throw malformed("lists " + std::to_string(first) + " nodes, but this is node " +
                  std::to_string(node) + " (SLURM_NODEID)");
}

ShardGroup shard_group(const JobPlacement& job, int ranks_per_shard) {
  const int k = ranks_per_shard;
  if (k < 1 || job.world_size % k != 0) {
    throw Error("param 'ranks_per_shard' (" + std::to_string(k) +
                ") must divide the job's ranks (" + std::to_string(job.world_size) + ")");
  }
  return {job.rank / k, job.world_size / k, job.rank % k};
}

const JobPlacement& job_placement(const BuildContext& context) {
  static const JobPlacement alone;
  const JobPlacement* placement = context.find<JobPlacement>();
  return placement ? *placement : alone;
}

JobPlacement job_placement_from_env() {
  JobPlacement p;
  if (env("WORLD_SIZE") || env("RANK")) {
    p.launcher = "torchrun";
    p.world_size = env_int("WORLD_SIZE", 1, 1);
    p.rank = env_int("RANK", 0, 0);
    p.local_rank = env_int("LOCAL_RANK", p.rank, 0);
    p.local_world_size = env_int("LOCAL_WORLD_SIZE", 1, 1);
    p.master_addr = env("MASTER_ADDR").value_or("127.0.0.1");
    p.master_port = env_int("MASTER_PORT", 0, 0);
    p.agent_store = env("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
    p.restart = env_int("TORCHELASTIC_RESTART_COUNT", 0, 0);
    if (p.rank >= p.world_size) {
      throw Error("RANK=" + std::to_string(p.rank) + " must be below WORLD_SIZE=" +
                  std::to_string(p.world_size));
    }
  } else if (env("SLURM_PROCID") && env("SLURM_NTASKS")) {
    p.launcher = "slurm";
    p.world_size = env_int("SLURM_NTASKS", 1, 1);
    p.rank = env_int("SLURM_PROCID", 0, 0);
    p.local_rank = env_int("SLURM_LOCALID", 0, 0);
    // The tasks of this step on this node share its cores (each rank plans its own share, as
    // under torchrun), unless Slurm grants each its own CPUs.
    const char* per_node =
        env("SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE" : "SLURM_TASKS_PER_NODE";
    if (const std::optional<std::string> list = env(per_node)) {
      p.local_world_size = slurm_tasks_on_node(*list, env_int("SLURM_NODEID", 0, 0), per_node);
    }
    p.cpus_per_rank = env_int("SLURM_CPUS_PER_TASK", 0, 1);
    p.master_addr = env("MASTER_ADDR").value_or(first_slurm_host(
        env("SLURM_JOB_NODELIST").value_or(env("SLURM_NODELIST").value_or("127.0.0.1"))));
    p.master_port = env_int("MASTER_PORT", 0, 0);
    if (p.rank >= p.world_size) {
      throw Error("SLURM_PROCID=" + std::to_string(p.rank) + " must be below SLURM_NTASKS=" +
                  std::to_string(p.world_size));
    }
  }
  return p;
}

}  // namespace flowtrain
