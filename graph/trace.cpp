#include "graph/trace.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "graph/atomic_file.hpp"
#include "graph/json_writer.hpp"

namespace flowtrain::detail {

void TraceRecorder::span(std::uint32_t stage,
                         std::uint64_t seq,
                         Clock::time_point begin,
                         Clock::time_point end) {
  using std::chrono::nanoseconds;
  spans_.local().push_back({stage, seq,
                            std::chrono::duration_cast<nanoseconds>(begin - start_).count(),
                            std::chrono::duration_cast<nanoseconds>(end - start_).count()});
}

void TraceRecorder::write(const std::string& path, const RunReport& report) const {
  std::ostringstream out;
  out << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  const char* sep = "";
  int tid = 0;
  for (const std::vector<Span>& spans : spans_) {
    ++tid;
    out << sep << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":" << tid
        << ",\"args\":{\"name\":\"worker " << tid << "\"}}";
    sep = ",\n";
    for (const Span& s : spans) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "%.3f,\"dur\":%.3f", s.begin_ns / 1e3,
                    (s.end_ns - s.begin_ns) / 1e3);
      out << sep << "{\"name\":\"" << json_escape(report.stages[s.stage].name)
          << "\",\"cat\":\"stage\",\"ph\":\"X\",\"pid\":1,\"tid\":" << tid << ",\"ts\":" << buf
          << ",\"args\":{\"item\":" << s.seq << "}}";
    }
  }
  // What stages timed inside their items: a process per stage, a thread per track.
  int pid = 1;
  for (const StageReport& stage : report.stages) {
    if (stage.timeline.empty()) continue;
    ++pid;
    out << sep << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" << pid
        << ",\"args\":{\"name\":\"" << json_escape(stage.name) << "\"}}";
    std::vector<std::string> tracks;
    for (const TimelineSpan& span : stage.timeline) {
      auto it = std::find(tracks.begin(), tracks.end(), span.track);
      if (it == tracks.end()) {
        tracks.push_back(span.track);
        it = tracks.end() - 1;
        out << sep << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" << pid
            << ",\"tid\":" << tracks.size() << ",\"args\":{\"name\":\""
            << json_escape(span.track) << "\"}}";
      }
      char buf[96];
      std::snprintf(buf, sizeof buf, "%.3f,\"dur\":%.3f", span.begin_s * 1e6,
                    (span.end_s - span.begin_s) * 1e6);
      out << sep << "{\"name\":\"" << json_escape(span.label)
          << "\",\"cat\":\"timeline\",\"ph\":\"X\",\"pid\":" << pid
          << ",\"tid\":" << (it - tracks.begin() + 1) << ",\"ts\":" << buf
          << ",\"args\":{\"item\":" << span.item << "}}";
    }
  }
  for (const StageReport& stage : report.stages) {
    for (const QueueSample& q : stage.queue_series) {
      out << sep << "{\"name\":\"queue " << json_escape(stage.name)
          << "\",\"ph\":\"C\",\"pid\":1,\"ts\":" << q.time_s * 1e6
          << ",\"args\":{\"items\":" << q.occupancy << "}}";
    }
  }
  out << "\n]}\n";
  write_file_atomically(path, out.str());
}

}  // namespace flowtrain::detail
