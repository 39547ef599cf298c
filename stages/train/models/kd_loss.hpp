#pragma once

#include <torch/types.h>

namespace flowtrain::train {

/// How the distillation loss weighs its parts.
struct KdLossOptions {
  double alpha = 1.0;        // weight of the cross-entropy on labels; 1 - alpha for distillation
  double temperature = 1.0;  // softens both distributions in the distillation term
  double regression_weight = 0;
  /// The regression term is the mean absolute error (torch's l1_loss) instead of the mean
  /// squared error: the median is its optimum, not the mean, so outliers pull it less.
  bool regression_l1 = false;
  /// The label cross-entropy's target puts 1 - label_smoothing on the label and spreads
  /// label_smoothing over all classes (Szegedy et al.; torch's label_smoothing).
  double label_smoothing = 0;
  /// Hard distillation (DeiT): the distillation term is the cross-entropy against the teacher's
  /// top class instead of the KL of the softened distributions (temperature unused).
  bool hard = false;
};

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
