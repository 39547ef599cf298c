#include "distributed/exit.hpp"

#include <cstdlib>
#include <iostream>
#include <thread>

#include "distributed/job.hpp"
#include "distributed/world.hpp"

namespace flowtrain::dist {

std::string rank_prefix() {
  if (const World* world = World::current()) return "rank " + std::to_string(world->rank()) + ": ";
  const JobPlacement placement = job_placement_from_env();
  return placement.distributed() ? "rank " + std::to_string(placement.rank) + ": " : "";
}

void leave_now(int code) {
  std::cout << std::flush;
  std::cerr << std::flush;
  std::_Exit(code);
}

int exit_on_error(const std::exception& e, const std::string& program) {
  // The first line only: c10 appends a C++ backtrace to its messages.
  std::string message = e.what();
  message = message.substr(0, message.find("\nException raised from"));
  World* world = World::current();
  if (!world) {
    std::cerr << program << ": error: " << rank_prefix() << message << "\n";
    return 1;
  }
  world->report_failure(message);
  if (!dynamic_cast<const WorldError*>(&e)) message += "; " + world->diagnose();
  std::cerr << program << ": error: " << rank_prefix() << message << std::endl;
  // Rank 0 hosts the store: it stays for the others' next look (their waits check it every
  // beat), so that they report why it failed rather than that the store went away.
  if (world->rank() == 0 && world->size() > 1) {
    std::this_thread::sleep_for(kHeartbeatInterval * 5 / 2);
  }
  leave_now(1);
}

}  // namespace flowtrain::dist
