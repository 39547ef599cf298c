#pragma once

#include <torch/types.h>

#include <span>

#include "graph/options.hpp"

namespace flowtrain::train {

/// How the student learns from the teacher's outputs (param distillation).
enum class Distillation { kSoft, kHard };
inline std::span<const EnumName<Distillation>> enum_names(Distillation) {
  static constexpr EnumName<Distillation> names[] = {{Distillation::kSoft, "soft"},
                                                     {Distillation::kHard, "hard"}};
  return names;
}

/// The regression term (param regression_loss).
enum class RegressionLoss { kMse, kL1 };
inline std::span<const EnumName<RegressionLoss>> enum_names(RegressionLoss) {
  static constexpr EnumName<RegressionLoss> names[] = {{RegressionLoss::kMse, "mse"},
                                                       {RegressionLoss::kL1, "l1"}};
  return names;
}

/// How the distillation loss weighs its parts: train_step's loss params (their keys flat in
/// YAML), with the same defaults.
struct KdLossOptions {
  double alpha = 0.5;        // weight of the cross-entropy on labels; 1 - alpha for distillation
  double temperature = 2.0;  // softens both distributions in the distillation term
  double regression_weight = 0;
  /// l1: the regression term is the mean absolute error (torch's l1_loss) instead of the mean
  /// squared error: the median is its optimum, not the mean, so outliers pull it less.
  RegressionLoss regression_loss = RegressionLoss::kMse;
  /// The label cross-entropy's target puts 1 - label_smoothing on the label and spreads
  /// label_smoothing over all classes (Szegedy et al.; torch's label_smoothing).
  double label_smoothing = 0;
  /// Hard distillation (DeiT): the distillation term is the cross-entropy against the teacher's
  /// top class instead of the KL of the softened distributions (temperature unused).
  Distillation distillation = Distillation::kSoft;

  template <class Declare>
  void declare(Declare& d) {
    d(alpha, "alpha",
      "weight of the label cross-entropy; 1 - alpha goes to distillation (1: supervised, no "
      "teacher needed)",
      {.min = 0, .max = 1});
    d(temperature, "temperature", "distillation temperature T", {.min = 0});
    d(regression_weight, "regression_weight", "weight of the regression term", {.min = 0});
    d(regression_loss, "regression_loss",
      "the regression term: mse (squared error, pulled by outliers) or l1 (absolute error: "
      "what a mean absolute error rewards)");
    d(label_smoothing, "label_smoothing",
      "share of the label cross-entropy's target spread over all classes", {.min = 0, .max = 0.99});
    d(distillation, "distillation",
      "soft: T^2 KL of the softened teacher and student distributions (Hinton); hard: "
      "cross-entropy against the teacher's top class (DeiT)");
  }
};

/// Throws flowtrain::Error ("kd_loss: alpha must be in [0, 1] ...") on options kd_loss refuses.
void check_kd_loss_options(const KdLossOptions& options);

/// The total loss and its parts, each a scalar tensor. `kd` is undefined without teacher logits
/// and `regression` without a regression prediction; the parts are unweighted.
struct KdLoss {
  torch::Tensor total;
  torch::Tensor ce;
  torch::Tensor kd;
  torch::Tensor regression;
};

/// Knowledge-distillation loss (Hinton et al. 2015):
///
///   total = alpha * CE(student, labels)
///         + (1 - alpha) * T^2 * KL(softmax(teacher / T) || softmax(student / T))
///         + regression_weight * MSE(student_regression, regression_targets)   (or L1)
///
/// CE is the mean over the batch, KL the sum over classes averaged over the batch ("batchmean"),
/// both from log_softmax; MSE the mean over all elements. The teacher is a constant (detached).
/// With alpha = 1 the teacher may be undefined (plain supervised training, see supervised_loss);
/// given anyway, its KL is computed and reported but not added. The regression pair may be
/// undefined when regression_weight is 0. Shapes: logits [B, C] floating, labels [B] int64 (or
/// [B, C] floating: each row's shares of the classes, as mixup makes them),
/// regression and targets [B, K] alike. `student_distillation`, when given ([B, C], DeiT's
/// distillation head), takes the distillation term in place of student_logits, which then
/// learn from the labels alone. Throws flowtrain::Error on bad options or shapes.
///
///   KdLoss loss = kd_loss(student_out.logits, teacher_out.logits, batch.labels,
///                         {.alpha = 0.5, .temperature = 2.0, .regression_weight = 0.1},
///                         student_out.regression, batch.targets);
///   loss.total.backward();
KdLoss kd_loss(const torch::Tensor& student_logits,
               const torch::Tensor& teacher_logits,
               const torch::Tensor& labels,
               const KdLossOptions& options,
               const torch::Tensor& student_regression = {},
               const torch::Tensor& regression_targets = {},
               const torch::Tensor& student_distillation = {});

/// Supervised loss without a teacher: kd_loss with alpha = 1 and no teacher logits, i.e.
/// CE(logits, labels) + regression_weight * MSE(regression, regression_targets), the CE with
/// label_smoothing.
///
///   KdLoss loss = supervised_loss(out.logits, batch.labels);
///   loss.total.backward();
KdLoss supervised_loss(const torch::Tensor& logits,
                       const torch::Tensor& labels,
                       double regression_weight = 0,
                       double label_smoothing = 0,
                       const torch::Tensor& regression = {},
                       const torch::Tensor& regression_targets = {});

}  // namespace flowtrain::train
