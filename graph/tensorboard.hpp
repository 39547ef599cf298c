#pragma once

// TensorBoard's event files, written without TensorFlow: what `tensorboard --logdir DIR`
// reads. A run's scalars (config key `metrics.tensorboard`) go through it.

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <string_view>

namespace flowtrain {

/// CRC-32C (Castagnoli) of `bytes`, as TFRecord frames use it.
std::uint32_t crc32c(std::string_view bytes);

/// One TFRecord: the length (uint64, little-endian), its masked CRC-32C, `data`, and the data's
/// masked CRC-32C.
std::string tf_record(std::string_view data);

/// An event file `events.out.tfevents.SECONDS.HOST.PID.N` in `dir` (created with its parents),
/// opened with the `brain.Event:2` version event. Each scalar is one Event holding a Summary
/// of one simple_value. Thread-safe; each call is a buffered write, flushed every few seconds
/// and when the writer is destroyed (TensorBoard reads a file that grows).
///   EventWriter events("runs/tb/distill");
///   events.scalar("train/loss", step, loss);
class EventWriter {
 public:
  /// Throws Error naming the folder or file if it cannot be created.
  explicit EventWriter(const std::string& dir);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  /// `tag` at `step`, stamped with the wall-clock time now. Throws Error naming the file if
  /// the write fails.
  void scalar(const std::string& tag, std::int64_t step, double value);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write(const std::string& event);

  std::mutex mutex_;
  std::string path_;
  std::FILE* file_ = nullptr;
  double flushed_s_ = 0;  // wall-clock time of the last flush
};

}  // namespace flowtrain
