// foodtag: distils a teacher (a ResNet by default) into a small ViT student that tags food
// photos with their food group and an energy estimate (kcal per 100 g). See README.md; the
// graph of each phase:
//
//   csv_manifest -> decode_crop (x2) -> assemble_batch -> train_step "teacher"
//   csv_manifest -> decode_crop (x2) -> assemble_batch -> teacher_cache --hit------------+
//                                                          `-miss-> teacher_infer (x2) -> merge
//                                                                        -> train_step "student"
//   csv_manifest -> jpeg_decode (x2) -> augment (eval) -> collate -> evaluate
//
//   foodtag prepare         fetch the photos and tables (npm), stratified train/val manifests
//   foodtag train-teacher   phase teacher
//   foodtag distill         phases precompute (with views_per_image > 0) and distill
//   foodtag sweep           one student per point of sweep.grid, against the teacher cache
//   foodtag eval            phases teacher_eval, student_eval
//   foodtag export          TorchScript teacher.pt / student.pt, size and inference speed
//   foodtag report          report.html from what the run folder holds
//   foodtag predict IMG...  top food groups and energy of photos
//   foodtag run             all of the above but predict, in turn
//   foodtag cv --folds K    train-teacher, distill, baseline and eval on K folds: every photo
//                           held out once; top-1 over all of them, McNemar over all of them
//   foodtag config          each phase as the commands run it: every stage's options and params
//
// Every command takes [-c CONFIG] and key.path=value overrides; errors print one line, exit 1.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "apps/foodtag/commands.hpp"
#include "distributed/launch.hpp"
#include "distributed/exit.hpp"
#include "distributed/world.hpp"
#include "runner/run_phases.hpp"

namespace {
// The config `foodtag` reads without -c: the one installed beside it
// (PREFIX/bin/foodtag -> PREFIX/share/flowtrain/foodtag/foodtag.yaml), else the source tree's,
// for the binary of a build folder.
std::string default_config() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const std::filesystem::path installed =
        exe.parent_path().parent_path() / FOODTAG_INSTALLED_CONFIG;
    if (std::filesystem::is_regular_file(installed, ec)) return installed.string();
  }
  return FOODTAG_DEFAULT_CONFIG;
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "foodtag: distil a teacher (a ResNet by default) into a small ViT student that tags food "
      "photos"};
  app.require_subcommand(1);
  foodtag::Invocation in;
  in.config_path = default_config();

  auto add_common = [&](CLI::App* cmd) {
    cmd->add_option("-c,--config", in.config_path, "foodtag config (YAML)")->capture_default_str();
    cmd->add_option("overrides", in.overrides,
                    "key.path=value overrides, e.g. data.val_fraction=0.3 "
                    "phases.distill.stages.source.params.epochs=5");
    return cmd;
  };
  // The commands that run phases may run them as N local ranks of a data-parallel job.
  auto add_job = [&](CLI::App* cmd) {
    cmd->add_option("--nproc", in.nproc, "Run the phases as N ranks of a data-parallel job")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--timeout", in.timeout_s,
                    "Seconds a rank waits for the others (rendezvous, collectives)")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
  };
  add_common(app.add_subcommand("prepare", "Fetch the food photos and tables; write manifests"));
  add_job(add_common(app.add_subcommand("train-teacher", "Train the teacher (phase teacher)")));
  add_job(add_common(
      app.add_subcommand("distill", "Distil the teacher into the student (phase distill)")));
  add_job(add_common(app.add_subcommand(
      "baseline", "Train the student on the labels alone, as distill would (phase baseline)")));
  add_job(add_common(
      app.add_subcommand("eval", "Validation accuracy of teacher, student and baseline")));
  add_common(app.add_subcommand("export", "Write both models as TorchScript; measure their speed"));
  add_common(app.add_subcommand("report", "Write the HTML report of the run folder"));
  CLI::App* sweep = add_common(app.add_subcommand(
      "sweep", "Train a student per point of sweep.grid against the teacher cache; a table"));
  int sweep_folds = 0;
  sweep
      ->add_option("--folds", sweep_folds,
                   "On the K folds of `foodtag cv --folds K`: a student per point and fold")
      ->check(CLI::Range(2, 100));
  add_job(add_common(
      app.add_subcommand("run", "prepare, train-teacher, distill, baseline, eval, export, report")));
  CLI::App* cv = app.add_subcommand(
      "cv", "K-fold evaluation: every photo held out once; top-1 over all, per fold, McNemar");
  int cv_folds = 5;
  cv->add_option("--folds", cv_folds, "Folds (each holds out 1/K of every food group)")
      ->check(CLI::Range(2, 100))
      ->capture_default_str();
  add_job(add_common(cv));
  CLI::App* predict = app.add_subcommand("predict", "Tag photos with the student");
  predict->add_option("-c,--config", in.config_path, "foodtag config (YAML)")->capture_default_str();
  predict
      ->add_option("images", in.images,
                   "Photos to tag (JPEG, PNG...); key.path=value arguments are overrides")
      ->required();
  predict->add_option("--model", in.model, "TorchScript model (default: OUTPUT/student.pt)");
  predict->add_option("--top", in.top, "Food groups shown per photo")->capture_default_str();
  add_common(app.add_subcommand(
      "config", "Print each phase as foodtag runs it: every stage's options and params"));
  CLI::App* keys = app.add_subcommand("keys", "List the app's own config keys");
  bool markdown = false;
  keys->add_flag("--markdown", markdown, "As the Markdown table in README.md");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::cerr << "foodtag: error: " << e.what() << " (see --help)\n";
    return 1;
  }
  flowtrain::dist::exit_with_launcher();
  const std::string command = app.get_subcommands()[0]->get_name();
  if (command == "cv") in.folds = cv_folds;
  if (command == "sweep") in.folds = sweep_folds;
  in.program = std::filesystem::read_symlink("/proc/self/exe").string();
  try {
    flowtrain::runner::check_timeout(in.timeout_s);  // CLI11 lets nan and 1e308 through
    if (command == "keys") {
      std::cout << foodtag::keys_text(markdown);
      return 0;
    }
    if (in.nproc > 1 && command != "run" && command != "cv") {
      // One line for a bad config (or for nothing to run), not one per rank.
      if (!foodtag::check_command(command, in)) return 0;
      return flowtrain::runner::relaunch_as_ranks(in.nproc, argc, argv);
    }
    const int code = foodtag::run_command(command, in);
    // Stopped early as a rank of a job: the peers' state is unknown.
    if (code != 0 && flowtrain::dist::World::current()) flowtrain::dist::leave_now(code);
    return code;
  } catch (const std::exception& e) {
    std::cout << std::flush;
    return flowtrain::dist::exit_on_error(e, "foodtag " + command);
  }
}
