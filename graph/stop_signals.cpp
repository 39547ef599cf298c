// Stop on SIGINT and SIGTERM: StopOnSignal asks the pipeline to stop (or, while the ranks of a
// job agree on when, casts this rank's vote), and a second signal ends the process the default
// way.
#include <csignal>

#include <atomic>

#include "graph/pipeline.hpp"
#include "graph/stop_vote.hpp"

namespace flowtrain {

namespace {
std::atomic<Pipeline*> g_signal_target{nullptr};
std::atomic<StopVote*> g_vote{nullptr};
std::atomic<int> g_received{0};
struct sigaction g_previous_int;
struct sigaction g_previous_term;

extern "C" void on_stop_signal(int signal) {
  g_received.store(signal);
  StopVote* vote = g_vote.load();
  if (vote && vote->held()) {
    vote->cast(signal);
  } else if (Pipeline* p = g_signal_target.load()) {
    p->request_stop();
  }
  // A second signal ends the process the default way.
  std::signal(signal, SIG_DFL);
}
}  // namespace

void StopVote::agreed(int signal) noexcept {
  agreed_.store(signal);
  if (Pipeline* p = pipeline_.load()) p->request_stop();
}

StopOnSignal::StopOnSignal(Pipeline& pipeline, StopVote* vote) : vote_(vote) {
  g_received.store(0);
  g_signal_target.store(&pipeline);
  if (vote) {  // a new watch: no vote cast yet
    vote->vote_.store(0);
    vote->agreed_.store(0);
    vote->pipeline_.store(&pipeline);
  }
  g_vote.store(vote);
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, &g_previous_int);
  sigaction(SIGTERM, &action, &g_previous_term);
}

int StopOnSignal::received() const {
  const int own = g_received.load();
  return own != 0 || !vote_ ? own : vote_->agreed_signal();
}

StopOnSignal::~StopOnSignal() {
  sigaction(SIGINT, &g_previous_int, nullptr);
  sigaction(SIGTERM, &g_previous_term, nullptr);
  g_vote.store(nullptr);
  g_signal_target.store(nullptr);
  if (vote_) vote_->pipeline_.store(nullptr);
}

}  // namespace flowtrain
