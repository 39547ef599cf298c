#include "stages/train/inference/teacher_cache.hpp"

#include <torch/torch.h>

#include <array>
#include <cstring>
#include <filesystem>

#include "distributed/world.hpp"
#include "graph/error.hpp"
#include "stages/data/splitmix.hpp"
#include "stages/train/models/compute.hpp"

namespace flowtrain::train {

namespace {

// The digest of one row's exact view: its image, every augmentation parameter, the recipe of
// the stages that made its pixels and, for a row `mixup` mixed, the digest of the mix (an unmixed
// row's digest is the same as before mixup existed, so older caches stay valid).
ViewDigest view_digest(const std::string& path, const data::ViewKey& view) {
  std::array<std::uint8_t, 7 * sizeof(float) + 1 + sizeof view.recipe> params;
  std::uint8_t* at = params.data();
  const data::AugmentParams& a = view.augment;
  for (float v : {a.crop_x, a.crop_y, a.crop_w, a.crop_h, a.brightness, a.contrast, a.saturation}) {
    std::memcpy(at, &v, sizeof v);
    at += sizeof v;
  }
  *at++ = static_cast<std::uint8_t>(a.flip);
  std::memcpy(at, &view.recipe, sizeof view.recipe);
  const std::span<const std::uint8_t> name(reinterpret_cast<const std::uint8_t*>(path.data()),
                                           path.size());
  ViewDigest digest{data::hash_bytes(params, data::hash_bytes(name, 0x7465616368657221ULL)),
                    data::hash_bytes(params, data::hash_bytes(name, 0x63616368652d6b31ULL))};
  if (view.mix != 0) {
    digest.hi = data::splitmix64(digest.hi ^ view.mix);
    digest.lo = data::splitmix64(digest.lo ^ ~view.mix);
  }
  return digest;
}

// Sets the batch's teacher outputs to the stored entries of `keys` (waiting for those an
// earlier batch computes).
void fill_from_cache(data::Batch& batch,
                     TeacherOutputCache& cache,
                     const std::vector<ViewDigest>& keys) {
  std::vector<std::uint8_t> entries;  // every row's stored outputs, one after another
  for (const ViewDigest& key : keys) cache.entry(key, entries);
  const EntryFormat format = *cache.format();
  const std::size_t entry_bytes = format.payload_bytes();
  const auto rows = static_cast<std::int64_t>(keys.size());
  torch::Tensor logits = torch::empty({rows, format.classes});
  torch::Tensor regression;
  if (format.regression > 0) regression = torch::empty({rows, format.regression});
  for (std::int64_t r = 0; r < rows; ++r) {
    decode_outputs(
        format, entries.data() + static_cast<std::size_t>(r) * entry_bytes,
        logits.data_ptr<float>() + r * format.classes,
        format.regression > 0 ? regression.data_ptr<float>() + r * format.regression : nullptr);
  }
  batch.teacher_logits = std::move(logits);
  batch.teacher_regression = std::move(regression);
}

// A batch's rows the cache lacks, on its way through teacher_infer.
class CachePending final : public data::TeacherOutputsPending {
 public:
  CachePending(std::shared_ptr<TeacherOutputCache> cache,
               std::vector<ViewDigest> keys,
               std::vector<std::int64_t> rows,
               std::uint64_t teacher)
      : cache_(std::move(cache)),
        keys_(std::move(keys)),
        rows_(std::move(rows)),
        teacher_(teacher) {
    for (std::int64_t r : rows_) computed_.push_back(keys_[static_cast<std::size_t>(r)]);
  }
  ~CachePending() override {
    if (!stored_) cache_->abandon(computed_);
  }

  const std::vector<std::int64_t>& rows() const override { return rows_; }

  void complete(data::Batch& batch,
                const at::Tensor& logits,
                const at::Tensor& regression,
                double forward_s,
                std::uint64_t teacher) override {
    if (!rows_.empty()) {
      if (teacher != teacher_) {
        throw Error(
            "teacher_infer runs another teacher than the teacher_cache before it names "
            "(its model file or autocast differ): give both the same model and autocast");
      }
      const auto n = static_cast<std::int64_t>(rows_.size());
      const torch::Tensor l = logits.to(torch::kFloat).contiguous();
      if (l.dim() != 2 || l.size(0) != n) {
        throw Error("the teacher returned logits of shape " + c10::str(l.sizes()) + " for " +
                    std::to_string(n) + " rows");
      }
      torch::Tensor r;
      if (regression.defined()) r = regression.to(torch::kFloat).contiguous().view({n, -1});
      cache_->store(computed_, l.data_ptr<float>(), static_cast<std::uint32_t>(l.size(1)),
                    r.defined() ? r.data_ptr<float>() : nullptr,
                    r.defined() ? static_cast<std::uint32_t>(r.size(1)) : 0, forward_s);
    }
    stored_ = true;
    fill_from_cache(batch, *cache_, keys_);
  }

 private:
  std::shared_ptr<TeacherOutputCache> cache_;
  std::vector<ViewDigest> keys_;      // every row's
  std::vector<std::int64_t> rows_;    // the rows to compute
  std::vector<ViewDigest> computed_;  // their keys
  std::uint64_t teacher_;
  bool stored_ = false;
};

std::string hex(std::uint64_t v) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(v));
  return text;
}

}  // namespace

std::uint64_t teacher_fingerprint(const std::string& model, const std::string& autocast) {
  const std::string word = resolve_autocast(autocast);
  const std::uint64_t precision = word == "bf16" ? 0xbf16 : word == "fp16" ? 0xf16 : 0xf32;
  return data::splitmix64(hash_file(model) ^ precision);
}

TeacherCacheStage::TeacherCacheStage(const Options& options, const BuildContext& context)
    : o_(options) {
  if (o_.path.empty()) throw Error("param 'path' is required: the cache file");
  read_only_ = context.rehearsal();
  if (const dist::World* world = context.find<dist::World>(); world && world->size() > 1) {
    std::filesystem::path path(o_.path);
    const std::string ext = path.extension().string();
    path.replace_extension(".rank" + std::to_string(world->rank()) + "-of-" +
                           std::to_string(world->size()) + ext);
    o_.path = path.string();
  }
  if (o_.model.empty()) {
    throw Error("param 'model' is required: the teacher file teacher_infer runs");
  }
}

TeacherCacheStage::~TeacherCacheStage() = default;

StageDoc TeacherCacheStage::describe() {
  return {
      "Teacher outputs computed once, keyed by the exact view: a batch whose rows are all "
      "stored leaves through `hit` with them, around the teacher; the others through `miss` "
      "to teacher_infer, which computes and stores the missing rows. Merge both before the "
      "student.",
      option_specs<Options>()};
}

std::uint64_t TeacherCacheStage::teacher() const {
  std::call_once(teacher_once_,
                 [&] { teacher_ = teacher_fingerprint(o_.model, o_.autocast); });
  return teacher_;
}

TeacherOutputCache& TeacherCacheStage::cache_for(const data::Batch& batch) {
  if (cache_) return *cache_;
  const std::uint64_t recipe = batch.views.empty() ? 0 : batch.views.front().recipe;
  const std::string precision = resolve_autocast(o_.autocast);
  TeacherOutputCache::Options options;
  options.path = o_.path;
  options.fingerprint = {teacher(), recipe,
                         "teacher " + o_.model + " (" + hex(teacher()) +
                             (precision == "none" ? "" : ", " + precision) +
                             "), data recipe " + hex(recipe)};
  options.top_k = static_cast<std::uint32_t>(o_.top_k);
  options.dtype = o_.dtype;
  options.replace_on_mismatch = o_.on_mismatch == OnCacheMismatch::kReplace;
  options.wait_timeout_s = o_.wait_timeout_s;
  options.read_only = read_only_;
  cache_ = std::make_shared<TeacherOutputCache>(std::move(options));
  return *cache_;
}

std::optional<Routed<data::Batch>> TeacherCacheStage::process(data::Batch&& batch, ItemContext&) {
  if (batch.views.size() != static_cast<std::size_t>(batch.size()) ||
      batch.paths.size() != batch.views.size()) {
    throw Error(
        "the batch has no view key for every row; teacher_cache takes the batches of "
        "assemble_batch or collate");
  }
  TeacherOutputCache& cache = cache_for(batch);
  std::vector<ViewDigest> keys;
  keys.reserve(batch.views.size());
  for (std::size_t i = 0; i < batch.views.size(); ++i) {
    keys.push_back(view_digest(batch.paths[i], batch.views[i]));
  }
  const std::vector<TeacherOutputCache::Lookup> found = cache.lookup(keys);
  std::vector<std::int64_t> compute;
  bool all_stored = true;
  for (std::size_t i = 0; i < found.size(); ++i) {
    if (found[i] == TeacherOutputCache::Lookup::kCompute)
      compute.push_back(static_cast<std::int64_t>(i));
    all_stored = all_stored && found[i] == TeacherOutputCache::Lookup::kHit;
  }
  misses_ += compute.size();
  hits_ += found.size() - compute.size();
  if (all_stored) {
    fill_from_cache(batch, cache, keys);
    return Routed<data::Batch>{0, std::move(batch)};
  }
  batch.teacher_pending =
      std::make_shared<CachePending>(cache_, std::move(keys), std::move(compute), teacher());
  return Routed<data::Batch>{1, std::move(batch)};
}

std::vector<StageResult> TeacherCacheStage::live_results() const {
  return {{"hits", static_cast<double>(hits_.load())},
          {"misses", static_cast<double>(misses_.load())}};
}

std::vector<StageResult> TeacherCacheStage::results() const {
  const double hits = static_cast<double>(hits_.load());
  const double misses = static_cast<double>(misses_.load());
  std::vector<StageResult> out = {{"hits", hits}, {"misses", misses}};
  if (hits + misses > 0) out.push_back({"hit_rate", 100 * hits / (hits + misses)});
  if (!cache_) return out;
  const TeacherOutputCache::Stats s = cache_->stats();
  out.push_back({"entries", static_cast<double>(s.entries)});
  out.push_back({"disk_mb", static_cast<double>(s.file_bytes) / 1e6});
  if (s.entries > 0) {
    out.push_back(
        {"bytes_per_view", static_cast<double>(s.file_bytes) / static_cast<double>(s.entries)});
  }
  out.push_back({"saved_s", hits * s.seconds_per_entry});
  if (s.replaced) out.push_back({"replaced", 1});  // it was filled for another teacher or data
  if (s.dropped_bytes > 0) out.push_back({"torn_bytes_cut", static_cast<double>(s.dropped_bytes)});
  if (s.damaged_bytes > 0) out.push_back({"damaged_bytes", static_cast<double>(s.damaged_bytes)});
  return out;
}

FLOWTRAIN_REGISTER_STAGE("teacher_cache", TeacherCacheStage);

}  // namespace flowtrain::train
