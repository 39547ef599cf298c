// flowtrain: runs, checks and lists pipelines built from registered stages.
//
//   flowtrain run CONFIG [key.path=value ...]    run a config's pipeline (or its phases in
//                [--nproc N] [--timeout S]       turn), print each one's stage report; as one
//                [--report FILE.json]            rank of a data-parallel job when the launcher's
//                [--phases a,b]                  environment says so, or start N local ranks;
//                [--tensorboard DIR]             --report: rank 0 writes the reports of the
//                                                phases that ran (a stopped one's too) as JSON;
//                                                --phases: only those; --tensorboard: event
//                                                files of each phase's scalars
//   flowtrain check CONFIG [key.path=value ...]  validate only: print the graph of each phase and
//                                                exit 0, or one line naming the problem
//   flowtrain export CHECKPOINT --out FILE       write a trained model as TorchScript (for
//                [--format F] [--layout L]       flowtrain-predict or PyTorch), or its weights
//                [--init W [--init-skip P]]      as a state_dict or safetensors file for
//                                                load_state_dict (docs/models.md); --init: the
//                                                checkpoint's model with the weights of file W
//   flowtrain stages [--markdown]                every registered stage with its parameters
//
// run, check and stages take --plugin FILE.so (repeatable): a shared library of stages of one's
// own (graph/plugin.hpp), loaded before the config, whose `plugins:` list loads more.
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "distributed/exit.hpp"
#include "distributed/launch.hpp"
#include "distributed/world.hpp"
#include "graph/atomic_file.hpp"
#include "graph/config.hpp"
#include "graph/csv.hpp"
#include "graph/error.hpp"
#include "graph/plugin.hpp"
#include "graph/report_io.hpp"
#include "runner/run_phases.hpp"
#include "stages/data/sources/listing.hpp"
#include "stages/data/sources/shard.hpp"
#include "stages/data/sources/synthetic.hpp"
#include "stages/train/files/checkpoint.hpp"
#include "stages/train/files/torchscript.hpp"
#include "stages/train/files/weights.hpp"

namespace {

// Refuses a --report path that cannot be written (its folder missing, a folder in its place)
// before anything runs rather than once the run is over.
void check_report_path(const std::string& path) {
  try {
    flowtrain::check_can_write_atomically(path);
  } catch (const flowtrain::Error& e) {
    throw flowtrain::Error(std::string("--report: ") + e.what());
  }
}

// Runs the config's phases in turn (runner/run_phases.hpp: as a rank of a job when the
// launcher's environment says so); 130 when a signal stopped it. With a `report_path`, rank 0
// writes the reports of the phases that ran there as JSON, a stopped run's too.
struct RunFlags {
  double timeout_s = 300;
  std::string report_path;
  std::string tensorboard_dir;      // every phase's metrics.tensorboard
  std::vector<std::string> phases;  // empty: all
};

int run(const std::string& path,
        const std::vector<std::string>& overrides,
        const RunFlags& flags) {
  const std::string& report_path = flags.report_path;
  // A config error is this rank's alone: say it before joining the job.
  flowtrain::RunConfig config = flowtrain::load_run_config(path, overrides);
  if (!flags.tensorboard_dir.empty()) {
    for (flowtrain::PipelineConfig& phase : config.phases) {
      phase.run.tensorboard_dir = flags.tensorboard_dir;
    }
  }
  const flowtrain::runner::PhasesOutcome outcome = flowtrain::runner::run_phases(
      config, {.config_path = path,
               .overrides = overrides,
               .timeout_s = flags.timeout_s,
               .phases = flags.phases});
  if (!report_path.empty() && outcome.leader) {
    flowtrain::write_file_atomically(
        report_path, flowtrain::run_report_json(outcome.reports,
                                                {path, overrides, outcome.stopped.value_or("")}));
    std::cout << "report: " << report_path << std::endl;
  }
  if (!outcome.stopped) return 0;
  std::cerr << "flowtrain: stopped by " << *outcome.stopped << "\n";
  return 130;
}

int check(const std::string& path, const std::vector<std::string>& overrides) {
  const flowtrain::RunConfig config = flowtrain::load_run_config(path, overrides);
  for (const flowtrain::PipelineConfig& phase : config.phases) flowtrain::check_thread_budget(phase);
  std::size_t stages = 0;
  for (const flowtrain::PipelineConfig& phase : config.phases) {
    stages += flowtrain::expanded_stages(phase).size();
  }
  std::cout << path << ": ok (";
  if (!config.phases[0].name.empty()) std::cout << config.phases.size() << " phases, ";
  std::cout << stages << " stages)\n";
  for (const flowtrain::PipelineConfig& phase : config.phases) {
    const auto [threads, cores] = flowtrain::threads_and_cores(phase.run);
    std::cout << (phase.name.empty() ? "graph" : "phase " + phase.name) << " ("
              << flowtrain::count_text(threads, "graph thread") << ", "
              << flowtrain::count_text(cores, "core") << "):\n";
    std::istringstream lines(flowtrain::graph_text(flowtrain::stage_decls(phase)));
    for (std::string line; std::getline(lines, line);) std::cout << "  " << line << "\n";
  }
  return 0;
}

int gen_images(const flowtrain::data::SyntheticOptions& options) {
  const flowtrain::data::GeneratedDataset set = flowtrain::data::generate_jpeg_dataset(options);
  // A manifest beside the class folders, so the same files also read as a csv_manifest.
  const std::string manifest = options.root + "/manifest.csv";
  std::string text = "path,label\n";
  const std::string prefix = options.root + "/";
  for (const auto& f : set.files) {
    const std::string relative =
        f.path.rfind(prefix, 0) == 0 ? f.path.substr(prefix.size()) : f.path;
    text += flowtrain::csv_line({relative, std::to_string(f.label)});
  }
  flowtrain::write_file_atomically(manifest, text);
  std::cout << "wrote " << set.files.size() << " images (" << set.broken_count()
            << " deliberately broken) in " << options.classes << " classes to " << options.root
            << " and " << manifest << "\n";
  for (const auto& f : set.files) {
    if (f.broken != flowtrain::data::BrokenKind::kNone) {
      std::cout << "  broken (" << flowtrain::data::to_string(f.broken) << "): " << f.path << "\n";
    }
  }
  return 0;
}

int pack(const std::string& out,
         const std::string& folder,
         const std::string& manifest,
         int max_side) {
  const std::vector<flowtrain::data::DatasetEntry> entries =
      folder.empty()
          ? flowtrain::data::read_csv_manifest(manifest).entries
          : flowtrain::data::scan_image_folder(folder, {".jpg", ".jpeg", ".png"}).entries;
  std::size_t shown = 0;
  const flowtrain::data::PackResult result = flowtrain::data::pack_dataset(
      entries, out, max_side, [&](std::size_t done, std::size_t total) {
        if (done * 10 / std::max<std::size_t>(total, 1) > shown || done == total) {
          shown = done * 10 / std::max<std::size_t>(total, 1);
          std::cerr << "pack: " << done << "/" << total << "\n";
        }
      });
  std::cout << "wrote " << result.written << " records to " << out << " (" << result.resized
            << " re-encoded to max side " << max_side << ", " << result.skipped.size()
            << " skipped)\n";
  for (const auto& skip : result.skipped) {
    std::cout << "  skipped " << skip.path << ": " << skip.reason << "\n";
  }
  return 0;
}

struct ExportOptions {
  std::string checkpoint, out;
  std::string format;  // torchscript, state_dict, safetensors; empty: by out's extension
  std::string layout = "flowtrain";
  std::string init, init_skip;
};

int export_model(const ExportOptions& o) {
  namespace train = flowtrain::train;
  std::string format = o.format;
  if (format.empty()) {
    const bool safetensors = o.out.size() >= 12 && o.out.rfind(".safetensors") == o.out.size() - 12;
    format = safetensors ? "safetensors" : "torchscript";
  }
  if (format == "torchscript" && o.layout != "flowtrain") {
    throw flowtrain::Error("--layout " + o.layout +
                           " applies to --format state_dict or safetensors (a TorchScript "
                           "module keeps our names)");
  }
  if (!o.init_skip.empty() && o.init.empty()) {
    throw flowtrain::Error("--init-skip needs --init (the file whose other tensors are loaded)");
  }
  const train::Checkpoint checkpoint = train::read_checkpoint(o.checkpoint);
  train::ImageModel model = train::load_model(checkpoint);
  std::string weights_from = "the model in " + o.checkpoint + " (step " +
                             std::to_string(checkpoint.state.step) + ")";
  if (!o.init.empty()) {
    train::InitCounts counts;
    try {
      counts = train::init_weights(*model,
                                   {.path = o.init, .skip = train::skip_prefixes(o.init_skip)});
    } catch (const flowtrain::Error& e) {
      throw flowtrain::Error(std::string("--init: ") + e.what());
    }
    weights_from = "the model of " + o.checkpoint + " with the weights of " + o.init + " (" +
                   std::to_string(counts.loaded) + " tensors loaded, " +
                   std::to_string(counts.skipped) + " skipped)";
  }
  if (format == "torchscript") {
    train::export_torchscript(model, o.out);
    std::cout << "wrote " << o.out << ": TorchScript of " << weights_from << ", "
              << train::parameter_count(*model) << " parameters; run it with flowtrain-predict "
              << o.out << " IMAGE...\n";
    return 0;
  }
  const train::WeightsLayout layout = o.layout == "torchvision" ? train::WeightsLayout::kTorchvision
                                                                : train::WeightsLayout::kFlowtrain;
  train::StateDict weights;
  try {
    weights = train::model_weights(*model, layout);
  } catch (const flowtrain::Error& e) {
    throw flowtrain::Error(o.checkpoint + ": " + e.what());
  }
  train::write_weights(o.out, weights,
                       format == "safetensors" ? train::WeightsFormat::kSafetensors
                                               : train::WeightsFormat::kStateDict);
  std::cout << "wrote " << o.out << ": " << weights.size() << " tensors (" << format << ", "
            << o.layout << " names) of " << weights_from
            << (format == "safetensors" ? "; docs/models.md shows how PyTorch loads it\n"
                                        : "; in PyTorch: model.load_state_dict(torch.load(\"" +
                                              o.out + "\"))\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"flowtrain: run training pipelines as oneTBB flow graphs of stages"};
  app.require_subcommand(1);

  std::string config_path;
  std::vector<std::string> overrides;
  bool markdown = false;

  CLI::App* run_cmd = app.add_subcommand("run", "Run a pipeline config and print its stage report");
  run_cmd->add_option("config", config_path, "Pipeline config (YAML)")->required();
  run_cmd->add_option("overrides", overrides, "key.path=value overrides, e.g. threads=1");
  int nproc = 0;
  RunFlags flags;
  double& timeout_s = flags.timeout_s;
  std::string& report_path = flags.report_path;
  run_cmd->add_option("--nproc", nproc, "Start N ranks of a data-parallel job on this machine")
      ->check(CLI::PositiveNumber);
  run_cmd
      ->add_option("--timeout", timeout_s,
                   "Seconds to wait for the other ranks (rendezvous, collectives, barriers)")
      ->capture_default_str();  // checked below, with the other run checks: one line
  run_cmd->add_option("--report", report_path,
                      "Write the reports of the phases that ran as one JSON document (rank 0)");
  run_cmd->add_option("--phases", flags.phases,
                      "Run only these phases, in this order (comma-separated names)")
      ->delimiter(',');
  run_cmd->add_option("--tensorboard", flags.tensorboard_dir,
                      "Write TensorBoard event files of every phase here (metrics.tensorboard)");

  CLI::App* check_cmd =
      app.add_subcommand("check", "Validate a pipeline config without running it");
  check_cmd->add_option("config", config_path, "Pipeline config (YAML)")->required();
  check_cmd->add_option("overrides", overrides, "key.path=value overrides");

  CLI::App* stages_cmd =
      app.add_subcommand("stages", "List registered stages and their parameters");
  stages_cmd->add_flag("--markdown", markdown,
                       "Print the Markdown reference used in docs/config.md");

  std::vector<std::string> plugins;
  for (CLI::App* command : {run_cmd, check_cmd, stages_cmd}) {
    command
        ->add_option("--plugin", plugins,
                     "Load a shared library of stages (FLOWTRAIN_REGISTER_STAGE) first; "
                     "repeatable")
        ->allow_extra_args(false);  // one file each time: `--plugin a.so config.yaml`
  }

  flowtrain::data::SyntheticOptions synthetic;
  std::string size = "64x64";
  CLI::App* gen_cmd = app.add_subcommand(
      "gen-images", "Write a synthetic JPEG dataset (root/class_XX/img_XXXXX.jpg + manifest.csv)");
  gen_cmd->add_option("--out", synthetic.root, "Output folder")->required();
  // Signed, so that -1 is refused rather than read as 2^64 - 1.
  long long count = static_cast<long long>(synthetic.count);
  gen_cmd->add_option("--count", count, "Number of files")->capture_default_str();
  gen_cmd->add_option("--size", size, "WIDTHxHEIGHT")->capture_default_str();
  gen_cmd->add_option("--classes", synthetic.classes, "Number of classes")->capture_default_str();
  gen_cmd->add_option("--quality", synthetic.quality, "JPEG quality 1..100")->capture_default_str();
  gen_cmd->add_option("--seed", synthetic.seed, "Seed")->capture_default_str();
  gen_cmd
      ->add_option("--broken", synthetic.broken_fraction,
                   "Fraction of deliberately broken files (each kind in turn)")
      ->capture_default_str();

  std::string pack_out, pack_folder, pack_manifest;
  int max_side = 0;
  CLI::App* pack_cmd =
      app.add_subcommand("pack", "Pack an image folder or CSV manifest into one shard file");
  pack_cmd->add_option("--out", pack_out, "Shard file to write")->required();
  auto* folder_opt = pack_cmd->add_option("--folder", pack_folder, "ImageFolder root");
  auto* manifest_opt = pack_cmd->add_option("--manifest", pack_manifest, "CSV manifest");
  folder_opt->excludes(manifest_opt);
  pack_cmd->add_option("--max-side", max_side, "Re-encode images whose longer side is above this")
      ->capture_default_str();

  ExportOptions export_options;
  CLI::App* export_cmd = app.add_subcommand(
      "export",
      "Write a trained model (a checkpoint, e.g. final.pt) as a TorchScript file, or its weights "
      "as a PyTorch state_dict or safetensors file");
  export_cmd->add_option("checkpoint", export_options.checkpoint, "flowtrain checkpoint")
      ->required();
  export_cmd->add_option("--out", export_options.out, "File to write")->required();
  export_cmd
      ->add_option("--format", export_options.format,
                   "torchscript, state_dict (torch.load) or safetensors (default: safetensors "
                   "for a .safetensors file, else torchscript)")
      ->check(CLI::IsMember({"torchscript", "state_dict", "safetensors"}));
  export_cmd
      ->add_option("--layout", export_options.layout,
                   "names of a state_dict: flowtrain (ours: timm's ViT, torchvision's ResNet) or "
                   "torchvision (VisionTransformer's names for a ViT)")
      ->check(CLI::IsMember({"flowtrain", "torchvision"}))
      ->capture_default_str();
  export_cmd->add_option("--init", export_options.init,
                         "weights file (state_dict, safetensors) loaded into the checkpoint's "
                         "model before it is written");
  export_cmd->add_option("--init-skip", export_options.init_skip,
                         "with --init: comma-separated name prefixes left as in the checkpoint");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  flowtrain::dist::exit_with_launcher();
  try {
    for (const std::string& plugin : plugins) flowtrain::load_plugin(plugin);
    if (run_cmd->parsed()) flowtrain::runner::check_timeout(timeout_s);
    if (run_cmd->parsed() && !report_path.empty()) check_report_path(report_path);
    if (run_cmd->parsed() && nproc > 1) {
      // One line for a config error, or a config that does not fit N ranks, not one a rank.
      // Planned as rank 0 of the job will plan it: an entry's expansion may depend on being a
      // rank (train_step's partitions are nodes of one process, or ranks of a job).
      flowtrain::RunConfig config = flowtrain::load_run_config(config_path, overrides);
      for (flowtrain::PipelineConfig& phase : config.phases) {
        flowtrain::runner::plan_for_job(phase, {.world_size = nproc, .local_world_size = nproc});
      }
      return flowtrain::runner::relaunch_as_ranks(nproc, argc, argv);
    }
    if (run_cmd->parsed()) {
      const int code = run(config_path, overrides, flags);
      // Stopped early: the peers' state is unknown.
      if (flowtrain::dist::World::current()) flowtrain::dist::leave_now(code);
      return code;
    }
    if (check_cmd->parsed()) return check(config_path, overrides);
    if (gen_cmd->parsed()) {
      if (count < 1) {
        throw flowtrain::Error("--count must be a whole number >= 1, got " + std::to_string(count));
      }
      synthetic.count = static_cast<std::size_t>(count);
      if (std::sscanf(size.c_str(), "%dx%d", &synthetic.width, &synthetic.height) != 2 ||
          synthetic.width < 1 || synthetic.height < 1) {
        throw flowtrain::Error("--size must be WIDTHxHEIGHT, e.g. 640x360, got '" + size + "'");
      }
      return gen_images(synthetic);
    }
    if (pack_cmd->parsed()) {
      if (pack_folder.empty() == pack_manifest.empty()) {
        throw flowtrain::Error("pack needs --folder DIR or --manifest CSV");
      }
      return pack(pack_out, pack_folder, pack_manifest, max_side);
    }
    if (export_cmd->parsed()) return export_model(export_options);
    std::cout << (markdown ? flowtrain::stages_markdown() : flowtrain::stages_text());
    return 0;
  } catch (const std::exception& e) {
    // One line naming this rank, what failed, and which rank is to blame if another one is.
    return flowtrain::dist::exit_on_error(e, "flowtrain");
  }
}
