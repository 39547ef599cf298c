#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "graph/registry.hpp"
#include "stages/data/batch.hpp"
#include "stages/train/inference/teacher_output_cache.hpp"
#include "stages/train/models/compute.hpp"

namespace flowtrain::train {

/// How a teacher_cache stores outputs (param dtype).
inline std::span<const EnumName<EntryFormat::Dtype>> enum_names(EntryFormat::Dtype) {
  static constexpr EnumName<EntryFormat::Dtype> names[] = {
      {EntryFormat::Dtype::kFloat16, "float16"}, {EntryFormat::Dtype::kBFloat16, "bfloat16"}};
  return names;
}

/// What a teacher_cache filled by another teacher or data does (param on_mismatch).
enum class OnCacheMismatch { kError, kReplace };
inline std::span<const EnumName<OnCacheMismatch>> enum_names(OnCacheMismatch) {
  static constexpr EnumName<OnCacheMismatch> names[] = {{OnCacheMismatch::kError, "error"},
                                                        {OnCacheMismatch::kReplace, "replace"}};
  return names;
}

/// The params of the `teacher_cache` stage.
struct TeacherCacheOptions {
  std::string path;
  std::string model;
  std::string autocast = "none";
  std::int64_t top_k = 100;
  EntryFormat::Dtype dtype = EntryFormat::Dtype::kFloat16;
  OnCacheMismatch on_mismatch = OnCacheMismatch::kError;
  double wait_timeout_s = 600;
  template <class Declare>
  void declare(Declare& d) {
    d(path, "path", "the cache file (made if absent; one run at a time holds it)",
      {.type = ParamType::kOutputPath});
    d(model, "model",
      "the teacher file teacher_infer runs (its content is part of the cache's fingerprint)",
      {.type = ParamType::kOutputPath});
    declare_autocast(d, autocast);
    d(top_k, "top_k",
      "store every logit up to this many classes; above it the top_k and one value for the rest",
      {.min = 1, .max = 1 << 20});
    d(dtype, "dtype", "how outputs are stored");
    d(on_mismatch, "on_mismatch",
      "a cache filled by another teacher or from other data params: error, or replace it");
    d(wait_timeout_s, "wait_timeout_s",
      "how long a batch waits for a view an earlier batch of the run computes", {.min = 0});
  }
};

/// The teacher fingerprint of a cache entry: the content of the teacher file and the precision
/// it runs in (its `autocast`: none, bf16 or fp16). teacher_infer gives its own with the
/// outputs it stores.
std::uint64_t teacher_fingerprint(const std::string& model, const std::string& autocast);

/// Teacher outputs computed once, keyed by the exact view (TeacherOutputCache): before
/// teacher_infer, it looks up every row of a batch. A batch whose rows are all stored gets its
/// teacher outputs here and leaves through `hit`, around the teacher; any other leaves through
/// `miss` to teacher_infer, which runs the teacher on the missing rows only and stores what it
/// computes. A `merge` gives the student the batches back in order:
///
///   - {type: teacher_cache, params: {path: runs/kd/teacher.ftc, model: runs/kd/teacher/final.pt}}
///   - {type: teacher_infer, inputs: teacher_cache.miss, params: {model: runs/kd/teacher/final.pt}}
///   - {type: merge, inputs: [teacher_cache.hit, teacher_infer]}
///   - {type: train_step, ...}
///
/// The student always learns from the stored (float16) outputs, the first run included, so a
/// run with a warm cache gives the same weights as the run that filled it. Serial and in order:
/// which rows the teacher computes depends on the cache and the run alone, never on timing.
class TeacherCacheStage final : public Router<data::Batch, data::Batch> {
 public:
  using Options = TeacherCacheOptions;
  /// `context`: the run's services. On a rank of a job of N > 1 ranks (dist::World), which
  /// sees its own share of the samples, the file is PATH with ".rankR-of-N" before its
  /// extension.
  explicit TeacherCacheStage(const Options& options, const BuildContext& context = {});
  ~TeacherCacheStage() override;
  static StageDoc describe();
  static StageShape static_shape() {
    StageShape shape = shape_with_outputs({"hit", "miss"});
    shape.max_concurrency = kSerial;
    return shape;
  }
  StageShape shape() const override { return static_shape(); }
  bool requires_order() const override { return true; }
  const Options& options() const { return o_; }
  /// The teacher its entries are keyed by (teacher_fingerprint of `model` and `autocast`),
  /// computed once.
  std::uint64_t teacher() const;

  /// hits and misses (views), hit_rate %, entries in the file, disk_mb, bytes_per_view and
  /// saved_s: the teacher time the hits saved, at the forward time per view the file records.
  std::vector<StageResult> results() const override;
  std::vector<StageResult> live_results() const override;

 protected:
  std::optional<Routed<data::Batch>> process(data::Batch&& batch, ItemContext& ctx) override;

 private:
  TeacherOutputCache& cache_for(const data::Batch& batch);

  Options o_;
  std::shared_ptr<TeacherOutputCache> cache_;  // opened by the first batch, which has the recipe
  mutable std::once_flag teacher_once_;
  mutable std::uint64_t teacher_ = 0;
  bool read_only_ = false;  // built for a rehearsal: the file is never changed
  std::atomic<std::uint64_t> hits_{0}, misses_{0};
};

}  // namespace flowtrain::train
