#include <cstdio>
#include <iostream>

#include "apps/foodtag/commands/command.hpp"
#include "graph/error.hpp"
#include "stages/data/sources/class_medians.hpp"
#include "stages/train/inference/predictor.hpp"

namespace foodtag {

using flowtrain::Error;

int predict_command(const Context& ctx) {
  const fs::path model = ctx.in.model.empty() ? ctx.out_dir / "student.pt" : fs::path(ctx.in.model);
  if (ctx.in.model.empty()) check_model(model, "export");
  const fs::path labels_path = ctx.data_dir / "labels.txt";
  const std::vector<std::string> labels =
      fs::exists(labels_path) ? read_lines(labels_path) : std::vector<std::string>{};
  const flowtrain::train::Predictor predictor(model.string());
  // The median energy of each group's training photos: beside the head's estimate, what the
  // predicted group alone tells (the smaller error on the validation photos: see the report).
  std::optional<flowtrain::data::ClassTargetMedians> group_energy;
  if (const fs::path train = ctx.data_dir / "train.csv"; fs::exists(train)) {
    group_energy =
        flowtrain::data::class_target_medians(flowtrain::data::read_csv_manifest(train.string()));
  }
  int failed = 0;
  for (const auto& p : predictor.predict(ctx.in.images, ctx.in.top)) {
    if (!p.error.empty()) {
      // The others are still tagged; the exit code says some were not.
      std::cout << std::flush;
      std::cerr << "foodtag predict: " << p.path << ": " << p.error << "\n";
      ++failed;
      continue;
    }
    if (!labels.empty() && static_cast<std::int64_t>(labels.size()) != p.class_count) {
      throw Error(labels_path.string() + ": " + std::to_string(labels.size()) +
                  " food groups, but the model " + model.string() + " has " +
                  std::to_string(p.class_count) + " classes");
    }
    std::cout << p.path << "\n";
    for (std::size_t k = 0; k < p.classes.size(); ++k) {
      const auto c = static_cast<std::size_t>(p.classes[k]);
      char row[160];
      std::snprintf(row, sizeof row, "  %5.1f%%  %s\n", p.probabilities[k] * 100,
                    c < labels.size() ? labels[c].c_str() : ("class " + std::to_string(c)).c_str());
      std::cout << row;
    }
    if (!p.regression.empty()) {
      char row[96];
      std::snprintf(row, sizeof row, "  energy about %.0f kcal per 100 g\n", p.regression[0]);
      std::cout << row;
    }
    if (group_energy && !p.classes.empty()) {
      char row[96];
      std::snprintf(row, sizeof row, "  its group's median: %.0f kcal per 100 g\n",
                    group_energy->of(p.classes[0])[0]);
      std::cout << row;
    }
  }
  std::cout << std::flush;
  return failed > 0 ? 1 : 0;
}

}  // namespace foodtag
