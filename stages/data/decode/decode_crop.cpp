#include "stages/data/decode/decode_crop.hpp"

#include <algorithm>
#include <string>

#include "graph/error.hpp"
#include "stages/data/decode/image_decode.hpp"
#include "stages/data/decode/opencv_threads.hpp"
#include "stages/data/splitmix.hpp"
#include "stages/data/transforms/recipe.hpp"
#include "stages/data/transforms/render_normalized.hpp"

namespace flowtrain::data {

namespace {

/// Per-thread state: the decoder and the buffers it reuses from sample to sample.
struct CropScratch {
  JpegCropDecoder decoder;
  Image decoded;    // the crop's strip, or the whole image
  PixelRect crop;   // the view's rectangle in `decoded`
  Resample resample = Resample::kAreaWhenShrinking;
  Image resized;    // size x size RGB

  void trim() {
    if (decoded.pixels.capacity() > kKeepScratchBytes) PixelBuffer().swap(decoded.pixels);
  }
};

CropScratch& crop_scratch() {
  thread_local CropScratch scratch;
  return scratch;
}

/// Room reserved for the batches being filled at once (more grow the list). A slot is reused
/// once its batch's rows have all left (its weak pointer expired).
constexpr std::size_t kOpenBatches = 64;

}  // namespace

DecodeCropStage::DecodeCropStage(const Options& options, const BuildContext& context)
    : decode_(options.decode.decode_options()),
      policy_(options.decode.bad_samples, job_placement(context)),
      augment_(options.augment.policy()),
      size_(static_cast<int>(options.augment.size)),
      roi_(options.roi),
      normalize_(options.normalize),
      recipe_(mix_recipe(options.augment.recipe(mix_recipe(0, "decode_crop",
                                                            Params({{"roi", options.roi}}))),
                         "normalize", to_params(options.normalize))),
      batch_size_(options.batch_size),
      wait_timeout_s_(options.pool.wait_timeout_s),
      pool_(BatchPool::create(options.pool)),
      check_once_(options.check_whole_file == CheckWholeFile::kOnce),
      index_budget_(options.mcu_index_mb << 20) {
  keep_opencv_on_caller_thread();
  quiet_opencv_decode_errors();  // before the workers run
  open_.reserve(kOpenBatches);
}

StageDoc DecodeCropStage::describe() {
  return {
      "Decodes only the crop of each sample's view (train or eval, as augment draws it), "
      "renders it as augment does and writes it normalised into its row of a pooled batch; "
      "assemble_batch emits the batches.",
      option_specs<Options>()};
}

std::optional<BatchRow> DecodeCropStage::process(Sample&& sample, ItemContext& ctx) {
  CropScratch& scratch = crop_scratch();
  const bool decoded = policy_.decode(sample, ctx, [&](Sample& s) {
    std::span<const std::uint8_t> bytes;
    std::string error = sample_bytes(s, bytes, decode_.max_file_bytes);
    bool cropped = false;
    if (error.empty() && roi_) {
      // A file is known by its path and byte count. Its first view decodes it to the end (the
      // check); the next view of a file found whole re-encodes it into an MCU index, budget
      // allowing, from which that view and the later ones decode only their crop's MCUs.
      // Without room for it, later views stop below their crop.
      const std::uint64_t file =
          check_once_ ? hash_bytes({reinterpret_cast<const std::uint8_t*>(s.path.data()),
                                    s.path.size()},
                                   bytes.size())
                      : 0;
      const auto found = check_once_ ? indexed_.find(file) : indexed_.end();
      const McuIndexedJpeg* indexed = found != indexed_.end() ? found->second.get() : nullptr;
      if (indexed != nullptr) {
        s.augment = augment_.draw(s.index, s.epoch,
                                  static_cast<double>(indexed->width()) / indexed->height());
      } else if (scratch.decoder.read_header(bytes, decode_.max_pixels)) {
        s.augment = augment_.draw(s.index, s.epoch, scratch.decoder.aspect());
        const bool checked = check_once_ && checked_files_.count(file) > 0;
        if (checked && index_bytes_.load(std::memory_order_relaxed) < index_budget_) {
          if (auto fresh = scratch.decoder.index()) {
            const std::size_t held = fresh->bytes();
            const auto [at, inserted] = indexed_.emplace(file, std::move(fresh));
            if (inserted) index_bytes_.fetch_add(static_cast<std::int64_t>(held));
            indexed = at->second.get();
          }
        } else {
          cropped = scratch.decoder.decode(
              s.augment, size_, scratch.decoded, scratch.crop,
              checked ? JpegCropDecoder::ReadTo::kCropEnd : JpegCropDecoder::ReadTo::kImageEnd);
          if (cropped && checked) {
            stopped_below_crop_.fetch_add(1, std::memory_order_relaxed);
          } else if (cropped && check_once_) {
            checked_files_.insert(file);
          }
        }
      }
      if (indexed != nullptr) {
        cropped = scratch.decoder.decode(*indexed, s.augment, size_, scratch.decoded, scratch.crop);
        if (cropped) views_from_index_.fetch_add(1, std::memory_order_relaxed);
      }
      scratch.resample = Resample::kAreaFrom2x;
    }
    if (error.empty() && !cropped) {
      // Not a JPEG this decoder takes, or a refusal: the whole-image decoder decides and says why.
      error = decode_image(bytes, decode_, scratch.decoded).error;
      if (error.empty()) {
        const Image& image = scratch.decoded;
        s.augment = augment_.draw(s.index, s.epoch, static_cast<double>(image.width) / image.height);
        scratch.crop = crop_rect(s.augment, image.width, image.height);
        scratch.resample = Resample::kAreaWhenShrinking;
      }
    }
    release_encoded(s);
    return error;
  });
  if (!decoded) {
    scratch.trim();
    return std::nullopt;
  }

  BatchRow row;
  row.batch = ctx.seq() / static_cast<std::uint64_t>(batch_size_);
  row.row = static_cast<std::int64_t>(ctx.seq() % static_cast<std::uint64_t>(batch_size_));
  row.batch_size = batch_size_;
  row.position = sample.position;
  row.origin = sample.origin;
  row.buffers = buffers_for(row.batch, sample);
  BatchBuffers& buffers = *row.buffers;
  render_view_normalized(scratch.decoded, scratch.crop, sample.augment, size_, scratch.resample,
                         normalize_, scratch.resized,
                         buffers.images.data_ptr<float>() + row.row * 3 * size_ * size_);
  scratch.trim();
  buffers.labels.data_ptr<std::int64_t>()[row.row] = sample.label;
  std::copy(sample.targets.begin(), sample.targets.end(),
            buffers.targets.data_ptr<float>() + row.row * buffers.targets.size(1));
  row.view = {sample.index, sample.epoch, sample.augment, recipe_};
  row.path = std::move(sample.path);
  return row;
}

std::vector<StageResult> DecodeCropStage::results() const {
  std::vector<StageResult> out = policy_.results();
  out.push_back({"stopped_below_crop",
                 static_cast<double>(stopped_below_crop_.load(std::memory_order_relaxed))});
  out.push_back({"views_from_index",
                 static_cast<double>(views_from_index_.load(std::memory_order_relaxed))});
  out.push_back({"indexed_files", static_cast<double>(indexed_.size())});
  out.push_back({"index_mb", static_cast<double>(index_bytes_.load()) / (1 << 20)});
  return out;
}

std::shared_ptr<BatchBuffers> DecodeCropStage::buffers_for(std::uint64_t batch,
                                                           const Sample& sample) {
  const auto targets = static_cast<std::int64_t>(sample.targets.size());
  {
    std::lock_guard lock(open_mutex_);
    if (targets_ < 0) targets_ = targets;
    if (targets != targets_) {
      throw Error(sample.path + ": sample has " + std::to_string(targets) +
                  " targets, but the batch has " + std::to_string(targets_));
    }
    for (auto& [number, buffers] : open_) {
      if (number != batch) continue;
      if (auto held = buffers.lock()) return held;
    }
  }
  // Outside the lock: the pool may wait for a buffer, and other rows must go on meanwhile.
  std::shared_ptr<BatchBuffers> fresh =
      pool_->acquire(batch_size_, 3, size_, size_, targets, wait_timeout_s_);
  std::lock_guard lock(open_mutex_);
  for (auto& [number, buffers] : open_) {
    if (number != batch) continue;
    if (auto held = buffers.lock()) return held;  // another row of the batch was first
  }
  const auto expired = std::find_if(open_.begin(), open_.end(),
                                    [](const auto& slot) { return slot.second.expired(); });
  if (expired != open_.end()) {
    *expired = {batch, fresh};
  } else {
    open_.emplace_back(batch, fresh);
  }
  return fresh;
}

FLOWTRAIN_REGISTER_STAGE("decode_crop", DecodeCropStage);

}  // namespace flowtrain::data
