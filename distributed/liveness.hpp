#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>
#include <vector>

namespace flowtrain::dist {

/// How the ranks of a job tell a dead peer from a slow one, through the rendezvous store: each
/// posts a heartbeat (a count and the time) under `heartbeat/<rank>` every kHeartbeatInterval,
/// and one that fails posts its message under `failed/<rank>`. A wait that would otherwise run
/// into the timeout watches the ranks it waits for (PeerWatch) and fails as soon as one of them
/// failed or its count stopped moving.

/// The store key `prefix/<rank>` (the layout every rank reads and writes).
std::string rank_key(const std::string& prefix, int rank);

std::vector<std::uint8_t> store_bytes(const std::string& text);
std::string store_text(const std::vector<std::uint8_t>& bytes);

/// A rank's last heartbeat; count -1 when it has posted none yet.
struct Heartbeat {
  std::int64_t count = -1;
  std::int64_t unix_ms = 0;
};

Heartbeat read_heartbeat(c10d::Store& from, int rank);

/// "rank 3 stopped responding 6 s ago (killed or hung?)".
std::string stale_text(int rank, const Heartbeat& last);

/// Posts this rank's heartbeat through `monitor` (a connection of its own, which others may
/// share under `monitor_mutex`): one at once, then from a thread every kHeartbeatInterval until
/// destroyed. A store gone is not its error to report: the failing collective says so.
class HeartbeatThread {
 public:
  HeartbeatThread(c10d::Store& monitor, std::mutex& monitor_mutex, int rank);
  ~HeartbeatThread();
  HeartbeatThread(const HeartbeatThread&) = delete;
  HeartbeatThread& operator=(const HeartbeatThread&) = delete;

 private:
  void beat();

  c10d::Store& monitor_;
  std::mutex& monitor_mutex_;
  const int rank_;
  std::int64_t beats_ = 0;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

/// The ranks one wait watches, over its successive checks.
class PeerWatch {
 public:
  /// A peer is taken as gone when its heartbeat has not advanced for this long (killed, or
  /// stopped by a debugger).
  static constexpr std::chrono::milliseconds kStaleAfter{5000};

  /// Throws WorldError if one of `ranks` posted a failure, or its heartbeat has not advanced
  /// since the checks before saw it, for kStaleAfter; `what` names the wait. Reads through
  /// `from` (the caller holds what guards it).
  void check(c10d::Store& from, const std::vector<int>& ranks, std::string_view what);

 private:
  using Clock = std::chrono::steady_clock;
  std::map<int, std::pair<Heartbeat, Clock::time_point>> seen_;
};

}  // namespace flowtrain::dist
