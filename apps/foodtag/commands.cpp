#include "apps/foodtag/commands.hpp"

#include <cstdio>
#include <regex>

#include "apps/foodtag/commands/command.hpp"
#include "graph/error.hpp"

namespace foodtag {

using flowtrain::Error;

bool check_command(const std::string& command, const Invocation& in) {
  const Context ctx = load_context(in);
  if (nothing_to_train(ctx, command)) return false;
  if (command_phases().count(command) != 0) check_phases(ctx, command, ctx.in.overrides);
  return true;
}

std::string keys_text(bool markdown) {
  if (markdown) return flowtrain::sections_markdown(sections());
  std::string out;
  for (const flowtrain::ConfigSection& s : sections()) {
    out += s.key + ":  " + s.doc + "\n";
    for (const flowtrain::ParamSpec& p : s.params) {
      char row[128];  // the doc is appended whole: a long one used to be cut at 256 characters
      std::snprintf(row, sizeof row, "    %-22s %-12s %-10s ", p.name.c_str(),
                    flowtrain::to_string(p.type), p.default_text().c_str());
      out += row + p.doc + "\n";
    }
  }
  return out;
}

int run_command(const std::string& command, Invocation in) {
  if (command == "predict") {
    // key.path=value arguments among the photos are overrides.
    static const std::regex kOverride(R"(^[A-Za-z_][A-Za-z0-9_.]*=.*)");
    std::vector<std::string> images;
    for (std::string& arg : in.images) {
      (std::regex_match(arg, kOverride) ? in.overrides : images).push_back(std::move(arg));
    }
    in.images = std::move(images);
  }
  const Context ctx = load_context(std::move(in));
  if (command == "prepare") return prepare_command(ctx);
  if (command == "export") return export_command(ctx);
  if (command == "report") return report_command(ctx);
  if (command == "predict") return predict_command(ctx);
  if (command == "config") return config_command(ctx);
  if (command == "sweep") return sweep_command(ctx);
  if (command == "cv") return cv_command(ctx);
  if (command_phases().count(command) != 0) {
    run_phases(ctx, command);
    return 0;
  }
  if (command == "run") return run_all_command(ctx);
  throw Error("unknown command '" + command + "'");
}

}  // namespace foodtag
