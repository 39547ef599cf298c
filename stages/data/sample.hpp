#pragma once

#include <cstdint>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace flowtrain::data {

/// An allocator that leaves new elements uninitialised: pixel buffers are always written in
/// full by whoever sizes them, so zero-filling them first would be a wasted pass over memory.
template <class T>
struct DefaultInitAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  using std::allocator<T>::allocator;
  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    std::allocator_traits<std::allocator<T>>::construct(static_cast<std::allocator<T>&>(*this), p,
                                                        std::forward<Args>(args)...);
  }
};

using PixelBuffer = std::vector<std::uint8_t, DefaultInitAllocator<std::uint8_t>>;

/// An 8-bit image in memory, interleaved (HWC) RGB once decoded. Plain memory, so the stages
/// that only carry it need neither OpenCV nor LibTorch; image stages wrap it in a cv::Mat
/// header without copying.
struct Image {
  int width = 0;
  int height = 0;
  int channels = 0;
  PixelBuffer pixels;  // height * width * channels bytes

  bool empty() const { return pixels.empty(); }
};

/// The random choices augmentation made for one sample, as fractions of the decoded image, so
/// they do not depend on the DCT scale the decoder picked. Derived from (seed, epoch, index)
/// alone; they travel with the sample because a teacher-output cache must key on the exact view.
struct AugmentParams {
  float crop_x = 0;  // left edge, fraction of the width
  float crop_y = 0;  // top edge, fraction of the height
  float crop_w = 1;  // fraction of the width
  float crop_h = 1;  // fraction of the height
  bool flip = false;
  float brightness = 1;
  float contrast = 1;
  float saturation = 1;

  bool operator==(const AugmentParams&) const = default;
};

/// Encoded image bytes a source already holds in memory: a view of them, and whatever keeps
/// them alive (a mapped shard, or a vector of the sample's own). Copies share the bytes.
struct EncodedBytes {
  std::span<const std::uint8_t> bytes;
  std::shared_ptr<const void> owner;

  /// Bytes of the sample's own (read from a file, received in a message).
  static EncodedBytes own(std::vector<std::uint8_t> data) {
    auto held = std::make_shared<const std::vector<std::uint8_t>>(std::move(data));
    return {std::span<const std::uint8_t>(*held), held};
  }
  bool empty() const { return bytes.empty(); }
  void reset() { *this = {}; }
};

/// One training example as it flows from a source through decode and augment to collate.
struct Sample;

/// Where a sample came from, so a decoding stage can ask for a stand-in when it cannot read it
/// (`on_bad_sample: replace`). Implemented by the dataset sources; thread-safe.
class SampleOrigin {
 public:
  /// The sample that stands in for `bad` on try `attempt` (0, 1, ...): another dataset index
  /// drawn from (seed, bad.epoch, bad.index, attempt), with bad's epoch and position, so every
  /// run and every rank makes the same choice.
  virtual Sample stand_in(const Sample& bad, std::uint32_t attempt) const = 0;

  /// Where the data-parallel ranks stand in the order they share once each has taken the
  /// source's items before position `end` (EpochCursor::shared_position): what a job resumed on
  /// another number of ranks starts from. std::nullopt where the ranks take different counts.
  virtual std::optional<std::uint64_t> shared_position(std::uint64_t end) const = 0;

 protected:
  ~SampleOrigin() = default;
};

struct Sample {
  std::uint64_t index = 0;  // position in the whole dataset: stable across epochs and ranks
  std::uint32_t epoch = 0;
  // Ordinal in the source's output over the run (behind a mix, in the mix's): where to resume.
  std::uint64_t position = 0;
  std::string path;            // the file, or "shard.ftpk#17" for a packed record; for messages
  std::int64_t label = -1;     // class id
  std::vector<float> targets;  // numeric targets (e.g. energy in kcal), may be empty
  EncodedBytes encoded;        // the image file's bytes; empty means decode reads `path`
  Image image;                        // decoded pixels, then the augmented view
  AugmentParams augment;              // what augment did (identity until then)
  /// A hash of the params that made its pixels so far (decode, view rendering, normalisation),
  /// each stage that shapes them mixing its own in: with `augment`, the exact view.
  std::uint64_t recipe = 0;
  const SampleOrigin* origin = nullptr;  // the source that made it, which outlives the run
};

}  // namespace flowtrain::data
