#include "stages/train/inference/predictor.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <span>

#include "graph/error.hpp"
#include "stages/data/decode/image_decode.hpp"
#include "stages/data/transforms/augment.hpp"
#include "stages/data/transforms/normalizer.hpp"

namespace flowtrain::train {

namespace {

constexpr std::size_t kBatch = 16;  // images per forward: bounds memory for long image lists

}  // namespace

// Options not given take the declared defaults of the stages an eval pipeline preprocesses with
// (collate's normalisation, augment's eval crop), so the predictor and a config preprocess alike.
struct Predictor::Impl {
  Impl(const std::string& path, const Options& o)
      : model(path),
        normalize(o.mean.empty() ? data::NormalizeOptions{}.mean : o.mean,
                  o.std.empty() ? data::NormalizeOptions{}.std : o.std),
        policy([] {
          data::AugmentPolicy::Options augment;
          augment.mode = data::AugmentPolicy::Mode::kEval;
          augment.eval_crop = data::AugmentOptions{}.eval_crop;
          return augment;
        }()) {}

  // Decodes the file at `path` into its eval view: what jpeg_decode then augment (mode eval)
  // give a pipeline.
  data::Image eval_view(const std::string& path, int size) const {
    std::vector<std::uint8_t> buffer;
    std::span<const std::uint8_t> bytes;
    if (const std::string error = read_file(path, buffer, bytes); !error.empty()) {
      throw Error("cannot read file: " + error);
    }
    data::Image decoded;
    if (const data::DecodeResult result = data::decode_image(bytes, decode, decoded);
        !result.ok()) {
      throw Error(result.error);
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
  impl_->decode.min_side =
      options.min_side < 0 ? impl_->policy.eval_decode_side(size_) : options.min_side;
}

Predictor::~Predictor() = default;

std::vector<Predictor::Prediction> Predictor::predict(const std::vector<std::string>& paths,
                                                      int top) const {
  if (top < 1) throw Error("top must be >= 1, got " + std::to_string(top));
  std::vector<Prediction> out(paths.size());
  for (std::size_t first = 0; first < paths.size(); first += kBatch) {
    const std::size_t count = std::min(kBatch, paths.size() - first);
    torch::Tensor images = torch::empty({static_cast<std::int64_t>(count), 3, size_, size_});
    std::vector<std::size_t> tagged;  // indices into `paths` of the images in `images`
    for (std::size_t i = first; i < first + count; ++i) {
      out[i].path = paths[i];
      try {
        const data::Image view = impl_->eval_view(paths[i], size_);
        impl_->normalize(view, images[static_cast<std::int64_t>(tagged.size())].data_ptr<float>());
        tagged.push_back(i);
      } catch (const Error& e) {
        out[i].error = e.what();
      }
    }
    if (tagged.empty()) continue;
    const ModelOutput result =
        impl_->model.forward(images.narrow(0, 0, static_cast<std::int64_t>(tagged.size())));
    const torch::Tensor probabilities = result.logits.to(torch::kFloat).softmax(1);
    const auto [values, indices] =
        probabilities.topk(std::min<std::int64_t>(top, probabilities.size(1)), 1);
    for (std::size_t row = 0; row < tagged.size(); ++row) {
      const auto r = static_cast<std::int64_t>(row);
      Prediction& p = out[tagged[row]];
      p.class_count = probabilities.size(1);
      for (std::int64_t k = 0; k < values.size(1); ++k) {
        p.classes.push_back(indices[r][k].item<std::int64_t>());
        p.probabilities.push_back(values[r][k].item<double>());
      }
      if (result.regression.defined()) {
        for (std::int64_t j = 0; j < result.regression.size(1); ++j) {
          p.regression.push_back(result.regression[r][j].item<double>());
        }
      }
    }
  }
  return out;
}

}  // namespace flowtrain::train
