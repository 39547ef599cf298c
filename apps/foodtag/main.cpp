// foodtag: distils a ViT teacher into a small ViT student that tags food photos with their food
// group and an energy estimate (kcal per 100 g). See README.md; the graph of each phase:
//
//   csv_manifest -> jpeg_decode (x2) -> augment (x2) -> collate -> student_step "teacher"
//   csv_manifest -> jpeg_decode (x2) -> augment (x2) -> collate -> teacher_infer (x2) -> student_step
//   csv_manifest -> jpeg_decode (x2) -> augment (eval) -> collate -> evaluate
//
//   foodtag prepare         fetch the photos and tables (npm), stratified train/val manifests
//   foodtag train-teacher   phase teacher
//   foodtag distill         phase distill
//   foodtag eval            phases teacher_eval, student_eval
//   foodtag export          TorchScript teacher.pt / student.pt, size and inference speed
//   foodtag report          report.html from what the run folder holds
//   foodtag predict IMG...  top food groups and energy of photos
//   foodtag run             all of the above but predict, in turn
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
#include "graph/error.hpp"

namespace {

// The first line of an error (c10 appends a C++ backtrace to its messages).
std::string first_line(const std::string& message) {
  return message.substr(0, message.find("\nException raised from"));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"foodtag: distil a ViT teacher into a small ViT student that tags food photos"};
  app.require_subcommand(1);
  foodtag::Invocation in;
  in.config_path = FOODTAG_DEFAULT_CONFIG;

  auto add_common = [&](CLI::App* cmd) {
    cmd->add_option("-c,--config", in.config_path, "foodtag config (YAML)")->capture_default_str();
    cmd->add_option("overrides", in.overrides,
                    "key.path=value overrides, e.g. data.val_fraction=0.3 "
                    "phases.distill.stages.source.params.epochs=5");
    return cmd;
  };
  add_common(app.add_subcommand("prepare", "Fetch the food photos and tables; write manifests"));
  add_common(app.add_subcommand("train-teacher", "Train the teacher (phase teacher)"));
  add_common(app.add_subcommand("distill", "Distil the teacher into the student (phase distill)"));
  add_common(app.add_subcommand("eval", "Validation accuracy of teacher and student"));
  add_common(app.add_subcommand("export", "Write both models as TorchScript; measure their speed"));
  add_common(app.add_subcommand("report", "Write the HTML report of the run folder"));
  add_common(app.add_subcommand("run", "prepare, train-teacher, distill, eval, export, report"));
  CLI::App* predict = app.add_subcommand("predict", "Tag photos with the student");
  predict->add_option("-c,--config", in.config_path, "foodtag config (YAML)")->capture_default_str();
  predict
      ->add_option("images", in.images,
                   "Photos to tag (JPEG, PNG...); key.path=value arguments are overrides")
      ->required();
  predict->add_option("--model", in.model, "TorchScript model (default: OUTPUT/student.pt)");
  predict->add_option("--top", in.top, "Food groups shown per photo")->capture_default_str();
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
  const std::string command = app.get_subcommands()[0]->get_name();
  try {
    if (command == "keys") {
      std::cout << foodtag::keys_text(markdown);
      return 0;
    }
    return foodtag::run_command(command, in);
  } catch (const std::exception& e) {
    std::cout << std::flush;
    std::cerr << "foodtag " << command << ": error: " << first_line(e.what()) << "\n";
    return 1;
  }
}
