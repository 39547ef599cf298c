#include <chrono>
#include <functional>
#include <iostream>

#include "apps/foodtag/commands/command.hpp"
#include "apps/foodtag/profile.hpp"

namespace foodtag {

int run_all_command(const Context& ctx) {
  using Clock = std::chrono::steady_clock;
  const auto begin = Clock::now();
  check_output_dir(ctx);
  std::vector<std::pair<std::string, double>> times;
  auto timed = [&](const std::string& step, const std::function<void()>& fn) {
    std::cout << "== foodtag " << step << "\n" << std::flush;
    const auto start = Clock::now();
    fn();
    times.emplace_back(step, std::chrono::duration<double>(Clock::now() - start).count());
  };
  timed("prepare", [&] { prepare_command(ctx); });
  for (const char* step : {"train-teacher", "distill", "baseline", "eval"}) {
    timed(step, [&] { ctx.in.nproc > 1 ? launch_phases(ctx, step) : run_phases(ctx, step); });
  }
  timed("export", [&] { export_command(ctx); });
  timed("report", [&] { report_command(ctx); });
  std::cout << "done in "
            << duration_text(std::chrono::duration<double>(Clock::now() - begin).count()) << ":";
  for (const auto& [step, s] : times) std::cout << " " << step << " " << duration_text(s);
  std::cout << "\n";
  return 0;
}

}  // namespace foodtag
