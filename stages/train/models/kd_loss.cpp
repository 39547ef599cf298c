#include "stages/train/models/kd_loss.hpp"

#include <torch/torch.h>

#include <sstream>
#include <string>

#include "graph/error.hpp"

namespace flowtrain::train {

namespace {

std::string shape(const torch::Tensor& tensor) {
  std::ostringstream out;
  out << tensor.sizes();
  return out.str();
}

void check_logits(const char* name, const torch::Tensor& logits) {
  if (logits.dim() != 2 || !logits.is_floating_point()) {
    throw Error(std::string("kd_loss: ") + name + " must be a floating [B, C] tensor, got " +
                shape(logits) + " " + std::string(c10::toString(logits.scalar_type())));
  }
}

}  // namespace

void check_kd_loss_options(const KdLossOptions& options) {
  if (!(options.alpha >= 0 && options.alpha <= 1)) {
    throw Error("kd_loss: alpha must be in [0, 1] (got " + std::to_string(options.alpha) + ")");
  }
  if (!(options.temperature > 0)) {
    throw Error("kd_loss: temperature must be > 0 (got " + std::to_string(options.temperature) +
                ")");
  }
  if (!(options.label_smoothing >= 0 && options.label_smoothing < 1)) {
    throw Error("kd_loss: label_smoothing must be in [0, 1) (got " +
                std::to_string(options.label_smoothing) + ")");
  }
  if (!(options.regression_weight >= 0)) {
    throw Error("kd_loss: regression_weight must be >= 0 (got " +
                std::to_string(options.regression_weight) + ")");
  }
}

KdLoss kd_loss(const torch::Tensor& student_logits,
               const torch::Tensor& teacher_logits,
               const torch::Tensor& labels,
               const KdLossOptions& options,
               const torch::Tensor& student_regression,
               const torch::Tensor& regression_targets,
               const torch::Tensor& student_distillation) {
  check_kd_loss_options(options);
  if (!student_logits.defined()) throw Error("kd_loss: student_logits is undefined");
  if (!labels.defined()) throw Error("kd_loss: labels is undefined");
  check_logits("student_logits", student_logits);
  const std::int64_t batch = student_logits.size(0);
  const bool class_labels =
      labels.dim() == 1 && labels.size(0) == batch && labels.scalar_type() == torch::kLong;
  const bool label_shares = labels.is_floating_point() && labels.sizes() == student_logits.sizes();
  if (!class_labels && !label_shares) {
    throw Error("kd_loss: labels must be int64 [" + std::to_string(batch) +
                "] or class shares shaped like the logits " + shape(student_logits) + ", got " +
                shape(labels) + " " + std::string(c10::toString(labels.scalar_type())));
  }
  if (student_distillation.defined()) {
    check_logits("student_distillation", student_distillation);
    if (student_distillation.sizes() != student_logits.sizes()) {
      throw Error("kd_loss: student_distillation " + shape(student_distillation) +
                  " and student_logits " + shape(student_logits) + " differ in shape");
    }
  }
  if (teacher_logits.defined()) {
    check_logits("teacher_logits", teacher_logits);
    if (teacher_logits.sizes() != student_logits.sizes()) {
      throw Error("kd_loss: teacher_logits " + shape(teacher_logits) + " and student_logits " +
                  shape(student_logits) + " differ in shape");
    }
  } else if (options.alpha < 1) {
    throw Error("kd_loss: no teacher_logits but alpha = " + std::to_string(options.alpha) +
                " < 1; pass the teacher's logits, or use alpha = 1 (supervised_loss)");
  }
  if (student_regression.defined() != regression_targets.defined()) {
    throw Error(std::string("kd_loss: ") +
                (student_regression.defined() ? "regression_targets" : "student_regression") +
                " is undefined but its counterpart is given");
  }
  if (options.regression_weight > 0 && !student_regression.defined()) {
    throw Error("kd_loss: regression_weight is " + std::to_string(options.regression_weight) +
                " but no student_regression and regression_targets were given");
  }
  if (student_regression.defined() &&
      (student_regression.dim() != 2 || student_regression.size(0) != batch ||
       regression_targets.sizes() != student_regression.sizes())) {
    throw Error("kd_loss: student_regression " + shape(student_regression) +
                " and regression_targets " + shape(regression_targets) + " must both be [" +
                std::to_string(batch) + ", K]");
  }

  KdLoss loss;
  namespace F = torch::nn::functional;
  loss.ce = options.label_smoothing > 0
                ? F::cross_entropy(student_logits, labels,
                                   F::CrossEntropyFuncOptions().label_smoothing(
                                       options.label_smoothing))
                : F::cross_entropy(student_logits, labels);
  loss.total = options.alpha * loss.ce;
  if (teacher_logits.defined()) {
    const torch::Tensor& student =
        student_distillation.defined() ? student_distillation : student_logits;
    const bool hard = options.distillation == Distillation::kHard;
    const double t = hard ? 1.0 : options.temperature;
    if (hard) {
      loss.kd = F::cross_entropy(student, teacher_logits.detach().argmax(1));
    } else {
      const torch::Tensor student_log_p = torch::log_softmax(student / t, 1);
      const torch::Tensor teacher_log_p = torch::log_softmax(teacher_logits.detach() / t, 1);
      // kl_div(input, target) is KL(target || input); log_target keeps the teacher in log space.
      loss.kd = F::kl_div(student_log_p, teacher_log_p,
                          F::KLDivFuncOptions().reduction(torch::kBatchMean).log_target(true));
    }
    // Skipped rather than multiplied by 0, so an infinite KL cannot turn the total into NaN.
    if (options.alpha < 1) {
      loss.total = loss.total + (1.0 - options.alpha) * t * t * loss.kd;
    }
  }
  if (student_regression.defined()) {
    loss.regression = options.regression_loss == RegressionLoss::kL1
                          ? torch::l1_loss(student_regression, regression_targets)
                          : torch::mse_loss(student_regression, regression_targets);
    if (options.regression_weight > 0) {
      loss.total = loss.total + options.regression_weight * loss.regression;
    }
  }
  return loss;
}

KdLoss supervised_loss(const torch::Tensor& logits,
                       const torch::Tensor& labels,
                       double regression_weight,
                       double label_smoothing,
                       const torch::Tensor& regression,
                       const torch::Tensor& regression_targets) {
  return kd_loss(logits, torch::Tensor(), labels,
                 KdLossOptions{.alpha = 1.0,
                               .temperature = 1.0,
                               .regression_weight = regression_weight,
                               .label_smoothing = label_smoothing},
                 regression, regression_targets);
}

}  // namespace flowtrain::train
