#include "stages/train/predictor.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <span>

#include "graph/error.hpp"
#include "graph/params.hpp"
#include "stages/data/augment.hpp"
#include "stages/data/collate.hpp"
#include "stages/data/jpeg_decode.hpp"

namespace flowtrain::train {

namespace {

constexpr std::size_t kBatch = 16;  // images per forward: bounds memory for long image lists

// A stage's declared default, so the predictor and a pipeline config preprocess alike.
template <class T>
T stage_default(const StageDoc& doc, const std::string& name) {
  return Params::defaults(doc.params).get<T>(name);
}

}  // namespace

struct Predictor::Impl {
  Impl(const std::string& path, const Options& o)
      : model(path),
        normalize(o.mean.empty() ? stage_default<std::vector<double>>(
                                       data::CollateStage::describe(), "mean")
                                 : o.mean,
                  o.std.empty() ? stage_default<std::vector<double>>(
                                      data::CollateStage::describe(), "std")
                                : o.std),
        policy([] {
          data::AugmentPolicy::Options augment;
          augment.mode = data::AugmentPolicy::Mode::kEval;
          augment.eval_crop = stage_default<double>(data::AugmentStage::describe(), "eval_crop");
          return augment;
        }()) {}

  // Decodes the file at `path` into its eval view: what jpeg_decode then augment (mode eval)
  // give a pipeline.
  data::Image eval_view(const std::string& path, int size) const {
    std::vector<std::uint8_t> buffer;
    std::span<const std::uint8_t> bytes;
    if (const std::error_code error = data::read_file(path, buffer, bytes)) {
      throw Error(path + ": cannot read file: " + error.message());
    }
    data::Image decoded;
    if (const data::DecodeResult result = data::decode_image(bytes, decode, decoded);
        !result.ok()) {
      throw Error(path + ": " + result.error);
    }
    const double aspect = static_cast<double>(decoded.width) / decoded.height;
    data::Image view;
    data::apply_augment(decoded, policy.draw(/*index=*/0, /*epoch=*/0, aspect), size, view);
    return view;
  }

  ScriptedModel model;
  data::Normalizer normalize;
  data::AugmentPolicy policy;
  data::DecodeOptions decode;
};

Predictor::Predictor(const std::string& model_path, Options options)
    : impl_(std::make_unique<Impl>(model_path, options)) {
  size_ = options.size > 0 ? options.size : impl_->model.image_size().value_or(224);
  impl_->decode.min_side = options.min_side < 0 ? size_ : options.min_side;
}

Predictor::~Predictor() = default;

std::vector<Predictor::Prediction> Predictor::predict(const std::vector<std::string>& paths,
                                                      int top) const {
  if (top < 1) throw Error("top must be >= 1, got " + std::to_string(top));
  std::vector<Prediction> out;
  for (std::size_t first = 0; first < paths.size(); first += kBatch) {
    const std::size_t count = std::min(kBatch, paths.size() - first);
    torch::Tensor images = torch::empty({static_cast<std::int64_t>(count), 3, size_, size_});
    for (std::size_t i = 0; i < count; ++i) {
      const data::Image view = impl_->eval_view(paths[first + i], size_);
      impl_->normalize(view, images[static_cast<std::int64_t>(i)].data_ptr<float>());
    }
    const ViTOutput result = impl_->model.forward(images);
    const torch::Tensor probabilities = result.logits.to(torch::kFloat).softmax(1);
    const auto [values, indices] =
        probabilities.topk(std::min<std::int64_t>(top, probabilities.size(1)), 1);
    for (std::size_t i = 0; i < count; ++i) {
      const auto row = static_cast<std::int64_t>(i);
      Prediction p;
      p.path = paths[first + i];
      p.class_count = probabilities.size(1);
      for (std::int64_t k = 0; k < values.size(1); ++k) {
        p.classes.push_back(indices[row][k].item<std::int64_t>());
        p.probabilities.push_back(values[row][k].item<double>());
      }
      if (result.regression.defined()) {
        for (std::int64_t r = 0; r < result.regression.size(1); ++r) {
          p.regression.push_back(result.regression[row][r].item<double>());
        }
      }
      out.push_back(std::move(p));
    }
  }
  return out;
}

}  // namespace flowtrain::train
