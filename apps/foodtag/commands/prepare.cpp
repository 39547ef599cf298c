#include "apps/foodtag/prepare.hpp"

#include <cstdio>
#include <iostream>

#include "apps/foodtag/commands/command.hpp"

namespace foodtag {

using flowtrain::Params;

int prepare_command(const Context& ctx) {
  const Params& data = ctx.section("data");
  PrepareOptions options;
  options.folder = ctx.data_dir.string();
  options.from = data.get_string("from");
  options.val_fraction = data.get_float("val_fraction");
  options.seed = static_cast<std::uint64_t>(data.get_int("seed"));
  options.shards = data.get_bool("shards");
  options.shard_max_side = static_cast<int>(data.get_int("shard_max_side"));
  const PrepareResult result =
      prepare(options, [](const std::string& line) { std::cout << line << std::endl; });
  std::size_t train = 0, val = 0;
  std::cout << "food groups (train / val):\n";
  for (const FoodGroup& g : result.groups) {
    char row[128];
    std::snprintf(row, sizeof row, "  %2d %s %-32s %4zu / %zu\n", g.label, g.code.c_str(),
                  g.name.c_str(), g.train, g.val);
    std::cout << row;
    train += g.train;
    val += g.val;
  }
  std::cout << "prepared " << train + val << " photos (" << train << " train, " << val
            << " validation, " << result.skipped.size() << " left out) in " << ctx.data_dir.string()
            << "\n";
  return 0;
}

}  // namespace foodtag
