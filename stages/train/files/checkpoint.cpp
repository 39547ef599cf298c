#include "stages/train/files/checkpoint.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/serialize/output-archive.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <span>

#include "graph/error.hpp"
#include "stages/train/files/torch_error.hpp"
#include "stages/train/files/zip_check.hpp"

namespace flowtrain::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormatKey = "flowtrain.format";
constexpr const char* kAverageKey = "average";  // WeightAverage's weights
constexpr const char* kDeviceRngKey = "rng.cuda";  // the GPU generator of a run on one
constexpr std::int64_t kFormatVersion = 1;

// The ModelConfig fields as (key, int member) and (key, double member) pairs: one list for both
// writing and reading, so they cannot drift apart.
constexpr std::pair<const char*, int ModelConfig::*> kIntFields[] = {
    {"image_size", &ModelConfig::image_size},
    {"patch_size", &ModelConfig::patch_size},
    {"channels", &ModelConfig::channels},
    {"dim", &ModelConfig::dim},
    {"depth", &ModelConfig::depth},
    {"heads", &ModelConfig::heads},
    {"classes", &ModelConfig::classes},
    {"regression_outputs", &ModelConfig::regression_outputs},
};
constexpr std::pair<const char*, double ModelConfig::*> kDoubleFields[] = {
    {"mlp_ratio", &ModelConfig::mlp_ratio},
    {"dropout", &ModelConfig::dropout},
    {"regression_scale", &ModelConfig::regression_scale},
};
// Fields added after the first checkpoints: a file without them has the defaults (a ViT).
constexpr std::pair<const char*, double ModelConfig::*> kNewDoubleFields[] = {
    {"drop_path", &ModelConfig::drop_path},
};
constexpr std::pair<const char*, std::string ModelConfig::*> kStringFields[] = {
    {"arch", &ModelConfig::arch},
    {"stem", &ModelConfig::stem},
    {"script", &ModelConfig::script},
    {"script_code", &ModelConfig::script_code},
};
constexpr std::pair<const char*, std::uint64_t TrainState::*> kStateFields[] = {
    {"step", &TrainState::step},
    {"total_steps", &TrainState::total_steps},
    {"data_position", &TrainState::data_position},
    {"skipped_steps", &TrainState::skipped_steps},
    {"world_size", &TrainState::world_size},
    {"zero_shards", &TrainState::zero_shards},
};
// State fields added later: a file without them has the defaults.
constexpr std::pair<const char*, std::uint64_t TrainState::*> kNewStateFields[] = {
    {"pipeline_ranks", &TrainState::partition_ranks},  // its name in files, from before the rename
};

// LibTorch's readers throw c10::Error, or std::runtime_error from its TorchScript parser, on a
// damaged file (found by fuzzing): one line naming the file instead, as for every bad input.
template <class F>
auto damaged_is_an_error(const std::string& path, F&& read) {
  try {
    return read();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(path + ": damaged checkpoint (" + short_reason(e) + ")");
  }
}

std::int64_t read_int(torch::serialize::InputArchive& archive,
                      const std::string& key,
                      const std::string& path) {
  c10::IValue value;
  if (!archive.try_read(key, value) || !value.isInt()) {
    throw Error(path + ": checkpoint has no '" + key + "' (written by another version?)");
  }
  return value.toInt();
}

}  // namespace

std::string checkpoint_bytes(const ImageModel& model,
                             const torch::optim::Optimizer* optimizer,
                             const TrainState& state,
                             const ImageModel* average,
                             const c10::Device& device) {
  torch::serialize::OutputArchive archive;
  archive.write(kFormatKey, c10::IValue(kFormatVersion));
  const ModelConfig& config = model->config();
  for (const auto& [key, field] : kIntFields) {
    archive.write(std::string("config.") + key, c10::IValue(std::int64_t{config.*field}));
  }
  for (const auto& [key, field] : kDoubleFields) {
    archive.write(std::string("config.") + key, c10::IValue(config.*field));
  }
  for (const auto& [key, field] : kNewDoubleFields) {
    archive.write(std::string("config.") + key, c10::IValue(config.*field));
  }
  for (const auto& [key, field] : kStringFields) {
    archive.write(std::string("config.") + key, c10::IValue(config.*field));
  }
  archive.write("config.distillation_token", c10::IValue(config.distillation_token));
  archive.write("config.stage_blocks",
                c10::IValue(std::vector<std::int64_t>(config.stage_blocks.begin(),
                                                      config.stage_blocks.end())));
  using StateFields = std::span<const std::pair<const char*, std::uint64_t TrainState::*>>;
  for (const StateFields fields : {StateFields(kStateFields), StateFields(kNewStateFields)}) {
    for (const auto& [key, field] : fields) {
      archive.write(std::string("state.") + key,
                    c10::IValue(static_cast<std::int64_t>(state.*field)));
    }
  }
  archive.write("state.epoch", c10::IValue(std::int64_t{state.epoch}));
  if (state.shared_data_position) {
    archive.write("state.shared_data_position",
                  c10::IValue(static_cast<std::int64_t>(*state.shared_data_position)));
  }
  if (state.loss_scale > 0) {
    archive.write("state.loss_scale", c10::IValue(state.loss_scale));
    archive.write("state.loss_scale_growth",
                  c10::IValue(static_cast<std::int64_t>(state.loss_scale_growth)));
  }
  archive.write("state.pipeline_splits",
                c10::IValue(std::vector<std::int64_t>(state.pipeline_splits.begin(),
                                                      state.pipeline_splits.end())));

  torch::serialize::OutputArchive weights;
  model->save(weights);
  archive.write("model", weights);
  if (average) {
    torch::serialize::OutputArchive averaged;
    (*average)->save(averaged);
    archive.write(kAverageKey, averaged);
  }
  if (optimizer) {
    torch::serialize::OutputArchive optimizer_state;
    optimizer->save(optimizer_state);
    archive.write("optimizer", optimizer_state);
  }
  {
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    archive.write("rng", generator.get_state());
  }
  if (device.is_cuda()) {  // dropout on the GPU draws from the device's generator
    at::Generator generator = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(generator.mutex());
    archive.write(kDeviceRngKey, generator.get_state());
  }
  std::string bytes;
  archive.save_to([&bytes](const void* data, std::size_t size) {
    bytes.append(static_cast<const char*>(data), size);
    return size;
  });
  return bytes;
}

void save_checkpoint(const std::string& path,
                     const ImageModel& model,
                     const torch::optim::Optimizer* optimizer,
                     const TrainState& state) {
  write_file_atomically(path, checkpoint_bytes(model, optimizer, state));
}

bool is_checkpoint(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec) && try_read_checkpoint(path).has_value();
}

Checkpoint read_checkpoint(const std::string& path) {
  if (std::optional<Checkpoint> checkpoint = try_read_checkpoint(path)) return std::move(*checkpoint);
  throw Error(path + ": not a flowtrain checkpoint (a TorchScript model, or not a LibTorch file)");
}

std::optional<Checkpoint> try_read_checkpoint(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) throw Error(path + ": no such checkpoint file");
  Checkpoint checkpoint;
  checkpoint.path = path;
  const MappedFile file = read_checked_archive(path, "checkpoint");
  const std::span<const std::uint8_t> bytes = file.bytes();
  try {
    // On the CPU, whatever device wrote it: the trainer moves what it restores to its own.
    checkpoint.archive.load_from(reinterpret_cast<const char*>(bytes.data()), bytes.size(),
                                 c10::Device(c10::DeviceType::CPU));
  } catch (const c10::Error&) {
    return std::nullopt;  // not a LibTorch archive at all
  } catch (const std::exception& e) {
    throw Error(path + ": damaged checkpoint (" + short_reason(e) + ")");
  }
  return damaged_is_an_error(path, [&]() -> std::optional<Checkpoint> {
    c10::IValue format;
    if (!checkpoint.archive.try_read(kFormatKey, format)) return std::nullopt;
    if (!format.isInt() || format.toInt() != kFormatVersion) {
      throw Error(path + ": checkpoint format " + format.toStringRef() + " is not supported");
    }
    for (const auto& [key, field] : kIntFields) {
      checkpoint.config.*field =
          static_cast<int>(read_int(checkpoint.archive, std::string("config.") + key, path));
    }
    for (const auto& [key, field] : kDoubleFields) {
      c10::IValue value;
      if (!checkpoint.archive.try_read(std::string("config.") + key, value) || !value.isDouble()) {
        throw Error(path + ": checkpoint has no 'config." + key + "'");
      }
      checkpoint.config.*field = value.toDouble();
    }
    ModelConfig& config = checkpoint.config;
    const auto optional = [&](const char* key, auto&& has_type, auto&& assign) {
      c10::IValue value;
      if (!checkpoint.archive.try_read(std::string("config.") + key, value)) return;
      if (!has_type(value)) throw Error(path + ": checkpoint's 'config." + key + "' is damaged");
      assign(value);
    };
    for (const auto& [key, field] : kNewDoubleFields) {
      optional(key, [](const c10::IValue& v) { return v.isDouble(); },
               [&, field = field](const c10::IValue& v) { config.*field = v.toDouble(); });
    }
    for (const auto& [key, field] : kStringFields) {
      optional(key, [](const c10::IValue& v) { return v.isString(); },
               [&, field = field](const c10::IValue& v) { config.*field = v.toStringRef(); });
    }
    optional("distillation_token", [](const c10::IValue& v) { return v.isBool(); },
             [&](const c10::IValue& v) { config.distillation_token = v.toBool(); });
    optional("stage_blocks", [](const c10::IValue& v) { return v.isIntList(); },
             [&](const c10::IValue& v) {
               for (std::int64_t blocks : v.toIntVector()) {
                 config.stage_blocks.push_back(static_cast<int>(blocks));
               }
             });
    for (const auto& [key, field] : kStateFields) {
      checkpoint.state.*field = static_cast<std::uint64_t>(
          read_int(checkpoint.archive, std::string("state.") + key, path));
    }
    for (const auto& [key, field] : kNewStateFields) {
      c10::IValue value;
      if (!checkpoint.archive.try_read(std::string("state.") + key, value)) continue;
      if (!value.isInt() || value.toInt() < 0) {
        throw Error(path + ": checkpoint's 'state." + key + "' is damaged");
      }
      checkpoint.state.*field = static_cast<std::uint64_t>(value.toInt());
    }
    checkpoint.state.epoch =
        static_cast<std::uint32_t>(read_int(checkpoint.archive, "state.epoch", path));
    if (c10::IValue shared; checkpoint.archive.try_read("state.shared_data_position", shared)) {
      if (!shared.isInt() || shared.toInt() < 0) {
        throw Error(path + ": checkpoint's 'state.shared_data_position' is damaged");
      }
      checkpoint.state.shared_data_position = static_cast<std::uint64_t>(shared.toInt());
    }
    if (c10::IValue scale; checkpoint.archive.try_read("state.loss_scale", scale)) {
      c10::IValue growth;
      if (!scale.isDouble() || !(scale.toDouble() > 0) ||
          !checkpoint.archive.try_read("state.loss_scale_growth", growth) || !growth.isInt() ||
          growth.toInt() < 0) {
        throw Error(path + ": checkpoint's 'state.loss_scale' is damaged");
      }
      checkpoint.state.loss_scale = scale.toDouble();
      checkpoint.state.loss_scale_growth = static_cast<std::uint64_t>(growth.toInt());
    }
    if (c10::IValue splits; checkpoint.archive.try_read("state.pipeline_splits", splits)) {
      const std::string damaged = path + ": checkpoint's 'state.pipeline_splits' is damaged";
      if (!splits.isIntList()) throw Error(damaged);
      for (const std::int64_t split : splits.toIntVector()) {
        if (split < 1 || split > 1 << 20) throw Error(damaged);
        checkpoint.state.pipeline_splits.push_back(static_cast<int>(split));
      }
    }
    // The file holds the model's weights, at least 2 bytes each: a damaged config must not
    // build a model larger than that (its fields could ask for any size).
    try {
      config.validate();
    } catch (const Error& e) {
      throw Error(path + ": damaged checkpoint (" + e.what() + ")");
    }
    if (const std::int64_t weights = config.min_parameters();
        weights > static_cast<std::int64_t>(bytes.size() / 2)) {
      throw Error(path + ": damaged checkpoint (its config, " + config.describe() +
                  ", has at least " + std::to_string(weights) + " parameters, more than its " +
                  std::to_string(bytes.size()) + " bytes hold)");
    }
    return std::move(checkpoint);
  });
}

namespace {
/// Loads the archive entry `key` ("model" or kAverageKey) into `model`; returns false if the
/// file has no such entry and `required` is false.
bool load_weights(const Checkpoint& checkpoint,
                  ImageModel& model,
                  const char* key = "model",
                  bool required = true) {
  bool found = false;
  damaged_is_an_error(checkpoint.path, [&] {
    torch::serialize::InputArchive weights;
    if (!checkpoint.archive.try_read(key, weights)) {
      if (required) throw Error(checkpoint.path + ": checkpoint has no " + key);
      return;
    }
    try {
      model->load(weights);
    } catch (const c10::Error& e) {
      throw Error(checkpoint.path + ": cannot load the " + key +
                  " weights: " + e.what_without_backtrace());
    }
    found = true;
  });
  return found;
}
}  // namespace

ImageModel load_model(const Checkpoint& checkpoint) {
  ImageModel model = make_model(checkpoint.config);
  if (!load_weights(checkpoint, model, kAverageKey, /*required=*/false)) {
    load_weights(checkpoint, model);
  }
  model->eval();
  return model;
}

void load_optimizer(const Checkpoint& checkpoint, torch::optim::Optimizer& optimizer) {
  damaged_is_an_error(checkpoint.path, [&] {
    torch::serialize::InputArchive optimizer_state;
    if (!checkpoint.archive.try_read("optimizer", optimizer_state)) {
      throw Error(checkpoint.path + ": checkpoint has no optimizer state (a model-only file)");
    }
    optimizer.load(optimizer_state);
  });
}

bool restore_training(const Checkpoint& checkpoint,
                      ImageModel model,
                      torch::optim::Optimizer* optimizer,
                      ImageModel* average,
                      const c10::Device& device) {
  if (std::string diff = config_difference(checkpoint.config, model->config()); !diff.empty()) {
    throw Error(checkpoint.path + ": the checkpoint's model differs from the configured one (" +
                diff + ")");
  }
  load_weights(checkpoint, model);
  const bool averaged = average && load_weights(checkpoint, *average, kAverageKey, false);
  if (optimizer) load_optimizer(checkpoint, *optimizer);
  damaged_is_an_error(checkpoint.path, [&] {
    torch::Tensor rng;
    if (checkpoint.archive.try_read("rng", rng)) {
      at::Generator generator = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(rng);
    }
    if (device.is_cuda() && checkpoint.archive.try_read(kDeviceRngKey, rng)) {
      at::Generator generator = at::globalContext().defaultGenerator(device);
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(rng);
    }
  });
  return averaged;
}

std::vector<std::string> step_checkpoints(const std::string& dir, int rank) {
  const std::string suffix = rank_file(".pt", rank);  // ".pt", ".pt.rank1", ...
  const std::size_t size = step_checkpoint_name(0).size() - 3 + suffix.size();
  std::vector<std::string> paths;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() == size && name.rfind("step-", 0) == 0 &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      paths.push_back(entry.path().string());
    }
  }
  // Fixed-width numbers: name order is step order.
  std::sort(paths.begin(), paths.end());
  return paths;
}

namespace {

// Whether every rank of `world_size` wrote its file of checkpoint `path` (rank 0's name).
bool written_by_every_rank(const std::string& path, int world_size) {
  std::error_code ec;
  for (int r = 0; r < world_size; ++r) {
    if (!fs::is_regular_file(rank_file(path, r), ec)) return false;
  }
  return true;
}

}  // namespace

std::optional<Checkpoint> latest_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return std::nullopt;
  // Newest first: final.pt, then the step files by falling step.
  std::vector<std::string> paths = step_checkpoints(dir);
  std::reverse(paths.begin(), paths.end());
  paths.insert(paths.begin(), (fs::path(dir) / "final.pt").string());
  for (const std::string& path : paths) {
    if (!fs::is_regular_file(path, ec)) continue;
    Checkpoint checkpoint = read_checkpoint(path);
    if (written_by_every_rank(path, static_cast<int>(checkpoint.state.world_size))) {
      return checkpoint;
    }
  }
  return std::nullopt;
}

std::vector<std::string> stale_step_checkpoints(const std::string& dir,
                                                int world_size,
                                                std::size_t keep) {
  // The oldest step to keep: the keep-th newest that every rank completed.
  const std::vector<std::string> steps = step_checkpoints(dir);
  std::size_t complete = 0;
  std::string oldest_kept;  // its file name ("step-00000036.pt")
  for (auto it = steps.rbegin(); it != steps.rend() && complete < keep; ++it) {
    if (!written_by_every_rank(*it, world_size)) continue;
    ++complete;
    oldest_kept = fs::path(*it).filename().string();
  }
  if (complete < keep) return {};
  // Every rank's files named below it, those of ranks a job on more ranks left included.
  // Fixed-width names: "step-N.pt.rankR" keeps rank 0's name as its prefix, and sorts below
  // oldest_kept where its step is older.
  const auto rank_suffix = [](std::string_view rest) {  // "", or ".rank" and digits
    if (rest.empty()) return true;
    if (rest.size() <= 5 || rest.substr(0, 5) != ".rank") return false;
    return rest.find_first_not_of("0123456789", 5) == std::string_view::npos;
  };
  std::vector<std::string> out;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() >= oldest_kept.size() && name.rfind("step-", 0) == 0 &&
        rank_suffix(std::string_view(name).substr(oldest_kept.size())) &&
        name.compare(0, oldest_kept.size(), oldest_kept) < 0) {
      out.push_back(entry.path().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string rank_file(const std::string& path, int rank) {
  return rank == 0 ? path : path + ".rank" + std::to_string(rank);
}

std::string step_checkpoint_name(std::uint64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08llu.pt", static_cast<unsigned long long>(step));
  return buf;
}

std::string config_difference(const ModelConfig& saved, const ModelConfig& wanted) {
  std::string out;
  for (const auto& [key, field] : kIntFields) {
    if (saved.*field != wanted.*field) {
      out += std::string(out.empty() ? "" : ", ") + key + " " + std::to_string(saved.*field) +
             " in the file, " + std::to_string(wanted.*field) + " configured";
    }
  }
  using DoubleFields = std::span<const std::pair<const char*, double ModelConfig::*>>;
  for (const DoubleFields fields : {DoubleFields(kDoubleFields), DoubleFields(kNewDoubleFields)}) {
    for (const auto& [key, field] : fields) {
      if (saved.*field != wanted.*field) {
        out += std::string(out.empty() ? "" : ", ") + key + " " + std::to_string(saved.*field) +
               " in the file, " + std::to_string(wanted.*field) + " configured";
      }
    }
  }
  // A scripted model is known by its code wherever its file lies now (one saved before its
  // code was kept, by the path it had).
  const bool by_code = !saved.script_code.empty();
  for (const auto& [key, field] : kStringFields) {
    if (field == (by_code ? &ModelConfig::script : &ModelConfig::script_code)) continue;
    if (field == &ModelConfig::script_code && saved.script_code != wanted.script_code) {
      out += std::string(out.empty() ? "" : ", ") + "the code of " + wanted.script +
             " is not that of the module it trained" +
             (saved.script == wanted.script ? "" : ", from " + saved.script);
    } else if (saved.*field != wanted.*field) {
      out += std::string(out.empty() ? "" : ", ") + key + " " + saved.*field + " in the file, " +
             wanted.*field + " configured";
    }
  }
  const auto yes_no = [](bool b) { return b ? std::string("yes") : std::string("no"); };
  if (saved.distillation_token != wanted.distillation_token) {
    out += std::string(out.empty() ? "" : ", ") + "distillation_token " +
           yes_no(saved.distillation_token) + " in the file, " +
           yes_no(wanted.distillation_token) + " configured";
  }
  if (saved.stage_blocks != wanted.stage_blocks) {
    out += std::string(out.empty() ? "" : ", ") + "stage_blocks " + saved.describe() +
           " in the file, " + wanted.describe() + " configured";
  }
  return out;
}

}  // namespace flowtrain::train
