#pragma once

#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "graph/atomic_file.hpp"
#include "stages/train/models/model.hpp"

namespace flowtrain::train {

/// Where a training run stands: enough, with the weights and optimizer state, to continue it
/// exactly.
struct TrainState {
  std::uint64_t step = 0;           // optimizer steps taken
  std::uint64_t total_steps = 0;    // length of the learning-rate schedule
  std::uint32_t epoch = 0;          // epoch of the last sample trained on
  std::uint64_t data_position = 0;  // source items consumed: the resumed run starts here
  /// The same in the order the data-parallel ranks share (data::EpochCursor::shared_position),
  /// where the source has one: what a job resumed on another number of ranks starts from.
  std::optional<std::uint64_t> shared_data_position;
  std::uint64_t skipped_steps = 0;  // batches skipped for a non-finite loss
  std::uint64_t world_size = 1;     // data-parallel ranks that trained (each writes its file)
  std::uint64_t zero_shards = 0;    // optimizer state in this many shards (ZeRO, partitions)
  /// Pipeline parallelism across this many ranks (0: none): each rank's optimizer state is that
  /// of its partition's parameters.
  std::uint64_t partition_ranks = 0;
  /// With a pipeline: the block indices where its model chunks begin (what a resumed run with
  /// partition_balance: measured splits at, since each rank's optimizer state follows them).
  std::vector<int> pipeline_splits;
  /// With float16 autocast: GradScaler's scale and its steps without an inf since it last
  /// changed (0: no loss scaling; not written then).
  double loss_scale = 0;
  std::uint64_t loss_scale_growth = 0;
};

/// A flowtrain checkpoint file as read: the model's shape, the training state, and the archive
/// holding weights ("model"), optimizer state ("optimizer") and the RNG state ("rng").
struct Checkpoint {
  std::string path;
  ModelConfig config;
  TrainState state;
  mutable torch::serialize::InputArchive archive;  // reading it is not const in LibTorch
};

/// A checkpoint file's bytes: the model's shape and weights, `state`, the global CPU RNG (and a
/// GPU `device`'s),
/// unless `optimizer` is null (a model-only file) the optimizer state, and unless `average` is
/// null the averaged weights (entry "average", WeightAverage), which load_model then gives.
/// Taking the bytes is what must happen between steps; writing them (write_file_atomically)
/// can happen later.
std::string checkpoint_bytes(const ImageModel& model,
                             const torch::optim::Optimizer* optimizer,
                             const TrainState& state,
                             const ImageModel* average = nullptr,
                             const c10::Device& device = c10::Device(c10::DeviceType::CPU));

/// checkpoint_bytes written with write_file_atomically:
///
///   save_checkpoint(dir + "/step-00000100.pt", model, &optimizer, state);
void save_checkpoint(const std::string& path,
                     const ImageModel& model,
                     const torch::optim::Optimizer* optimizer,
                     const TrainState& state);

/// True if `path` is a file written by save_checkpoint (false for TorchScript files and the rest).
bool is_checkpoint(const std::string& path);

/// Reads a checkpoint's header and archive; throws Error naming the path if it is missing or
/// not a flowtrain checkpoint.
Checkpoint read_checkpoint(const std::string& path);

/// The same, but std::nullopt for an existing file of another kind (a TorchScript module, a
/// text file), so a caller can try it as something else without reading it twice.
std::optional<Checkpoint> try_read_checkpoint(const std::string& path);

/// A model built from the checkpoint's config with its weights, in eval mode: the averaged
/// weights when the file has them (training with ema_decay), else the trained ones.
ImageModel load_model(const Checkpoint& checkpoint);

/// Puts the checkpoint's optimizer state into `optimizer` (on the CPU), whose parameters must be
/// those that wrote it, in the same groups; throws Error naming the file otherwise.
void load_optimizer(const Checkpoint& checkpoint, torch::optim::Optimizer& optimizer);

/// Puts the checkpoint's weights into `model`, its state into `optimizer` unless that is null
/// (both then on the CPU), and restores the global CPU random generator, and a GPU `device`'s
/// when the file has it. Throws Error if the model's shape differs from the file's. With
/// `average`: the file's averaged weights go into it, and the result says whether the file had
/// them (a run that did not average has not).
bool restore_training(const Checkpoint& checkpoint,
                      ImageModel model,
                      torch::optim::Optimizer* optimizer,
                      ImageModel* average = nullptr,
                      const c10::Device& device = c10::Device(c10::DeviceType::CPU));

/// The step files of rank `rank` in `dir` ("step-N.pt", or "step-N.pt.rankR" for R > 0),
/// oldest first; empty if none or no folder.
std::vector<std::string> step_checkpoints(const std::string& dir, int rank = 0);

/// The newest checkpoint in `dir` whose files exist for every rank that wrote it (a rank may
/// have died before writing), as read from rank 0's file: "final.pt" if so, else the
/// "step-N.pt" with the highest N; std::nullopt if there is none (or no folder). The number of
/// ranks is the file's, since a job may resume on another number. Throws Error for a damaged
/// file.
std::optional<Checkpoint> latest_checkpoint(const std::string& dir);

/// Every rank's step files in `dir` that are older than the newest `keep` checkpoints every
/// rank of `world_size` completed, in name order: what may be deleted and still leave a step
/// all ranks can resume from (a rank stopped early writes a step the others never reach; its
/// older files must outlive it). The files of ranks above the job's, left by a job on more
/// ranks that this one resumed, are among them. Any rank may delete them: the last to write a
/// step sees it completed, and deletes what the others could not yet.
std::vector<std::string> stale_step_checkpoints(const std::string& dir,
                                                int world_size,
                                                std::size_t keep);

/// The file rank `rank` writes for checkpoint `path`: `path` itself for rank 0, else
/// "path.rank<r>" (each rank keeps its own data position and, with ZeRO, optimizer shard).
std::string rank_file(const std::string& path, int rank);

/// "step-00000042.pt".
std::string step_checkpoint_name(std::uint64_t step);

/// A one-line description of how two configs differ ("dim 64 vs 32"), empty if equal.
std::string config_difference(const ModelConfig& saved, const ModelConfig& wanted);

}  // namespace flowtrain::train
