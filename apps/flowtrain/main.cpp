// flowtrain: runs, checks and lists pipelines built from registered stages.
//
//   flowtrain run CONFIG [key.path=value ...]   run a pipeline config, print its stage report
//   flowtrain check CONFIG [key.path=value ...] validate only: exit 0, or one line naming the
//   problem flowtrain stages [--markdown]               every registered stage with its parameters
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "graph/config.hpp"
#include "graph/error.hpp"

namespace {

// A live line on a terminal; a plain line every 10 s when stderr is a file or pipe.
void show_progress(const flowtrain::Progress& p, bool terminal) {
  const double rate = p.elapsed_s > 0 ? static_cast<double>(p.completed) / p.elapsed_s : 0;
  std::fprintf(stderr, "%s%8.1f s  produced %llu  completed %llu  %.0f items/s%s",
               terminal ? "\r" : "", p.elapsed_s, static_cast<unsigned long long>(p.produced),
               static_cast<unsigned long long>(p.completed), rate, terminal ? "\x1b[K" : "\n");
  std::fflush(stderr);
}

int run(const std::string& path, const std::vector<std::string>& overrides) {
  flowtrain::PipelineConfig config = flowtrain::load_pipeline_config(path, overrides);
  const bool terminal = isatty(STDERR_FILENO) != 0;
  config.run.progress_interval_s = terminal ? 0.5 : 10;
  config.run.on_progress = [terminal](const flowtrain::Progress& p) { show_progress(p, terminal); };
  std::unique_ptr<flowtrain::Pipeline> pipeline = flowtrain::build_pipeline(config);
  std::cout << "running " << path << ": " << config.stages.size() << " stages" << std::endl;
  flowtrain::RunReport report;
  {
    flowtrain::StopOnSignal stop_on_ctrl_c(*pipeline);
    report = pipeline->run(config.run);
  }
  if (terminal && report.wall_s >= config.run.progress_interval_s) std::fprintf(stderr, "\n");
  std::cout << flowtrain::format_report(report) << std::flush;
  return report.stopped ? 130 : 0;
}

int check(const std::string& path, const std::vector<std::string>& overrides) {
  const flowtrain::PipelineConfig config = flowtrain::load_pipeline_config(path, overrides);
  std::cout << path << ": ok (" << config.stages.size() << " stages)\n";
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

  CLI::App* check_cmd =
      app.add_subcommand("check", "Validate a pipeline config without running it");
  check_cmd->add_option("config", config_path, "Pipeline config (YAML)")->required();
  check_cmd->add_option("overrides", overrides, "key.path=value overrides");

  CLI::App* stages_cmd =
      app.add_subcommand("stages", "List registered stages and their parameters");
  stages_cmd->add_flag("--markdown", markdown,
                       "Print the Markdown reference used in docs/config.md");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (run_cmd->parsed()) return run(config_path, overrides);
    if (check_cmd->parsed()) return check(config_path, overrides);
    std::cout << (markdown ? flowtrain::stages_markdown() : flowtrain::stages_text());
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "flowtrain: error: " << e.what() << "\n";
    return 1;
  }
}
