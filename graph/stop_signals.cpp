// Stop on SIGINT and SIGTERM: StopOnSignal asks the pipeline to stop, and a second signal ends
// the process the default way.
#include <csignal>

#include <atomic>

#include "graph/pipeline.hpp"

namespace flowtrain {

namespace {
std::atomic<Pipeline*> g_signal_target{nullptr};
std::atomic<int> g_received{0};
struct sigaction g_previous_int;
struct sigaction g_previous_term;

extern "C" void on_stop_signal(int signal) {
  g_received.store(signal);
  if (Pipeline* p = g_signal_target.load()) p->request_stop();
  // A second signal ends the process the default way.
  std::signal(signal, SIG_DFL);
}
}  // namespace

StopOnSignal::StopOnSignal(Pipeline& pipeline) {
  g_received.store(0);
  g_signal_target.store(&pipeline);
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, &g_previous_int);
  sigaction(SIGTERM, &action, &g_previous_term);
}

int StopOnSignal::received() const { return g_received.load(); }

StopOnSignal::~StopOnSignal() {
  sigaction(SIGINT, &g_previous_int, nullptr);
  sigaction(SIGTERM, &g_previous_term, nullptr);
  g_signal_target.store(nullptr);
}

}  // namespace flowtrain
