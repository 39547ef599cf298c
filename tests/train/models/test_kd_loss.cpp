#include <doctest/doctest.h>
#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "graph/error.hpp"
#include "stages/train/models/kd_loss.hpp"

using namespace flowtrain;
using namespace flowtrain::train;

namespace {

using Matrix = std::vector<std::vector<double>>;

// The reference, in plain doubles, straight from the definitions.

std::vector<double> softmax(const std::vector<double>& row, double t) {
  double sum = 0;
  for (double x : row) sum += std::exp(x / t);
  std::vector<double> p;
  for (double x : row) p.push_back(std::exp(x / t) / sum);
  return p;
}

double reference_ce(const Matrix& logits, const std::vector<std::int64_t>& labels) {
  double sum = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    sum -= std::log(softmax(logits[i], 1.0)[static_cast<std::size_t>(labels[i])]);
  }
  return sum / static_cast<double>(logits.size());
}

// KL(softmax(teacher / t) || softmax(student / t)), summed over classes, averaged over rows.
double reference_kl(const Matrix& student, const Matrix& teacher, double t) {
  double sum = 0;
  for (std::size_t i = 0; i < student.size(); ++i) {
    const std::vector<double> p = softmax(teacher[i], t);
    const std::vector<double> q = softmax(student[i], t);
    for (std::size_t c = 0; c < p.size(); ++c) sum += p[c] * std::log(p[c] / q[c]);
  }
  return sum / static_cast<double>(student.size());
}

double reference_mse(const Matrix& prediction, const Matrix& target) {
  double sum = 0;
  std::size_t n = 0;
  for (std::size_t i = 0; i < prediction.size(); ++i) {
    for (std::size_t k = 0; k < prediction[i].size(); ++k, ++n) {
      sum += (prediction[i][k] - target[i][k]) * (prediction[i][k] - target[i][k]);
    }
  }
  return sum / static_cast<double>(n);
}

torch::Tensor tensor(const Matrix& m, torch::Dtype dtype = torch::kDouble) {
  std::vector<double> flat;
  for (const auto& row : m) flat.insert(flat.end(), row.begin(), row.end());
  return torch::tensor(flat, torch::kDouble)
      .reshape({static_cast<std::int64_t>(m.size()), static_cast<std::int64_t>(m[0].size())})
      .to(dtype);
}

double value(const torch::Tensor& t) { return t.item<double>(); }

const Matrix kStudent = {{1.0, 2.0, 0.5}, {-1.0, 0.0, 3.0}};
const Matrix kTeacher = {{2.0, 1.0, 0.0}, {0.5, 0.5, 2.5}};
const std::vector<std::int64_t> kLabels = {1, 2};
const Matrix kRegression = {{1.5, 0.0}, {-0.5, 2.0}};
const Matrix kTargets = {{1.0, 0.5}, {0.5, 2.0}};

}  // namespace

TEST_CASE("Train.KdLoss.MatchesHandComputedReference") {
  at::set_num_threads(1);
  const torch::Tensor labels = torch::tensor(kLabels, torch::kLong);
  const double alpha = 0.5;
  const double t = 2.0;
  const double ce = reference_ce(kStudent, kLabels);
  const double kl = reference_kl(kStudent, kTeacher, t);
  const double mse = reference_mse(kRegression, kTargets);
  // A second reference, independent of both: PyTorch 1.13.1 (Debian python3-torch) on the same
  // float64 tensors, F.cross_entropy(s, y), F.kl_div(F.log_softmax(s / 2, 1),
  // F.log_softmax(t / 2, 1), reduction="batchmean", log_target=True) and F.mse_loss(r, g).
  CHECK(ce == doctest::Approx(0.265126343933).epsilon(1e-11));
  CHECK(kl == doctest::Approx(0.088726276369).epsilon(1e-11));
  CHECK(mse == doctest::Approx(0.375).epsilon(1e-12));

  SUBCASE("float64, without regression") {
    const KdLoss loss =
        kd_loss(tensor(kStudent), tensor(kTeacher), labels, {.alpha = alpha, .temperature = t});
    CHECK(value(loss.ce) == doctest::Approx(ce).epsilon(1e-12));
    CHECK(value(loss.kd) == doctest::Approx(kl).epsilon(1e-12));
    CHECK_FALSE(loss.regression.defined());
    CHECK(value(loss.total) ==
          doctest::Approx(alpha * ce + (1 - alpha) * t * t * kl).epsilon(1e-12));
  }
  SUBCASE("float64, with a regression term") {
    const KdLoss loss = kd_loss(tensor(kStudent), tensor(kTeacher), labels,
                                {.alpha = alpha, .temperature = t, .regression_weight = 0.25},
                                tensor(kRegression), tensor(kTargets));
    CHECK(value(loss.regression) == doctest::Approx(mse).epsilon(1e-12));
    CHECK(value(loss.total) ==
          doctest::Approx(alpha * ce + (1 - alpha) * t * t * kl + 0.25 * mse).epsilon(1e-12));
    CHECK(value(loss.total) ==
          doctest::Approx(0.403765724704).epsilon(1e-11));  // PyTorch, as above
  }
  SUBCASE("float32, as in training") {
    const KdLoss loss =
        kd_loss(tensor(kStudent, torch::kFloat), tensor(kTeacher, torch::kFloat), labels,
                {.alpha = alpha, .temperature = t, .regression_weight = 0.25},
                tensor(kRegression, torch::kFloat), tensor(kTargets, torch::kFloat));
    CHECK((loss.total.scalar_type() == torch::kFloat));
    CHECK(value(loss.total) ==
          doctest::Approx(alpha * ce + (1 - alpha) * t * t * kl + 0.25 * mse).epsilon(1e-6));
  }
  SUBCASE("alpha 0 is pure distillation, and identical logits give 0") {
    const KdLoss pure =
        kd_loss(tensor(kStudent), tensor(kTeacher), labels, {.alpha = 0.0, .temperature = t});
    CHECK(value(pure.total) == doctest::Approx(t * t * kl).epsilon(1e-12));
    const KdLoss same =
        kd_loss(tensor(kStudent), tensor(kStudent), labels, {.alpha = 0.0, .temperature = t});
    CHECK(std::abs(value(same.total)) < 1e-15);
  }
}

TEST_CASE("Train.KdLoss.Alpha1IsCrossEntropy") {
  at::set_num_threads(1);
  const torch::Tensor labels = torch::tensor(kLabels, torch::kLong);
  const double ce = reference_ce(kStudent, kLabels);

  const KdLoss no_teacher =
      kd_loss(tensor(kStudent), torch::Tensor(), labels, {.alpha = 1.0, .temperature = 4.0});
  CHECK(value(no_teacher.total) == doctest::Approx(ce).epsilon(1e-12));
  CHECK(value(no_teacher.ce) == doctest::Approx(ce).epsilon(1e-12));
  CHECK_FALSE(no_teacher.kd.defined());

  // A teacher given anyway is reported but does not count.
  const KdLoss with_teacher =
      kd_loss(tensor(kStudent), tensor(kTeacher), labels, {.alpha = 1.0, .temperature = 4.0});
  CHECK(value(with_teacher.total) == doctest::Approx(ce).epsilon(1e-12));
  CHECK(value(with_teacher.kd) ==
        doctest::Approx(reference_kl(kStudent, kTeacher, 4.0)).epsilon(1e-12));

  const KdLoss supervised = supervised_loss(tensor(kStudent), labels);
  CHECK(value(supervised.total) == doctest::Approx(ce).epsilon(1e-12));
  CHECK(torch::equal(supervised.total, torch::cross_entropy_loss(tensor(kStudent), labels)));

  const KdLoss with_regression =
      supervised_loss(tensor(kStudent), labels, 2.0, 0.0, tensor(kRegression), tensor(kTargets));
  CHECK(value(with_regression.total) ==
        doctest::Approx(ce + 2.0 * reference_mse(kRegression, kTargets)).epsilon(1e-12));

  // regression_l1: the mean absolute error, (0.5 + 0.5 + 1 + 0) / 4, whose gradient is each
  // error's sign / 4 whatever its size (an outlier pulls no harder than any other row).
  const torch::Tensor regression = tensor(kRegression).requires_grad_(true);
  const KdLoss l1 = kd_loss(tensor(kStudent), torch::Tensor(), labels,
                            {.alpha = 1.0, .regression_weight = 2.0, .regression_loss = RegressionLoss::kL1},
                            regression, tensor(kTargets));
  CHECK(value(l1.regression) == doctest::Approx(0.5).epsilon(1e-12));
  CHECK(value(l1.total) == doctest::Approx(ce + 2.0 * 0.5).epsilon(1e-12));
  l1.total.backward();
  CHECK(torch::equal(regression.grad(), 2.0 * torch::tensor({{0.25, -0.25}, {-0.25, 0.0}},
                                                            torch::kDouble)));
}

TEST_CASE("Train.KdLoss.TeacherGetsNoGradient") {
  at::set_num_threads(1);
  const torch::Tensor student = tensor(kStudent).requires_grad_(true);
  const torch::Tensor teacher = tensor(kTeacher).requires_grad_(true);
  const KdLoss loss = kd_loss(student, teacher, torch::tensor(kLabels, torch::kLong),
                              {.alpha = 0.5, .temperature = 2.0});
  loss.total.backward();
  REQUIRE(student.grad().defined());
  CHECK(student.grad().abs().sum().item<double>() > 0);
  CHECK_FALSE(teacher.grad().defined());
}

TEST_CASE("Train.KdLoss.BadInputErrors") {
  const torch::Tensor s = tensor(kStudent);
  const torch::Tensor t = tensor(kTeacher);
  const torch::Tensor y = torch::tensor(kLabels, torch::kLong);
  const KdLossOptions ok{.alpha = 0.5, .temperature = 2.0};

  CHECK_THROWS_WITH_AS(kd_loss(s, t, y, {.alpha = 1.5, .temperature = 2.0}),
                       "kd_loss: alpha must be in [0, 1] (got 1.500000)", Error);
  CHECK_THROWS_WITH_AS(kd_loss(s, t, y, {.alpha = 0.5, .temperature = 0.0}),
                       "kd_loss: temperature must be > 0 (got 0.000000)", Error);
  CHECK_THROWS_WITH_AS(
      kd_loss(s, t, y, {.alpha = 0.5, .temperature = 2.0, .regression_weight = -1}),
      "kd_loss: regression_weight must be >= 0 (got -1.000000)", Error);
  CHECK_THROWS_WITH_AS(kd_loss(s, torch::Tensor(), y, ok),
                       "kd_loss: no teacher_logits but alpha = 0.500000 < 1; pass the teacher's "
                       "logits, or use alpha = 1 (supervised_loss)",
                       Error);
  CHECK_THROWS_WITH_AS(kd_loss(s, t.slice(1, 0, 2), y, ok),
                       "kd_loss: teacher_logits [2, 2] and student_logits [2, 3] differ in shape",
                       Error);
  CHECK_THROWS_WITH_AS(kd_loss(s.flatten(), t, y, ok),
                       "kd_loss: student_logits must be a floating [B, C] tensor, got [6] Double",
                       Error);
  CHECK_THROWS_WITH_AS(kd_loss(s, t, y.slice(0, 0, 1), ok),
                       "kd_loss: labels must be int64 [2] or class shares shaped like the logits [2, 3], got [1] Long",
                       Error);
  CHECK_THROWS_WITH_AS(kd_loss(s, t, y.to(torch::kInt), ok),
                       "kd_loss: labels must be int64 [2] or class shares shaped like the logits [2, 3], got [2] Int",
                       Error);
  CHECK_THROWS_WITH_AS(
      kd_loss(s, t, y, {.alpha = 0.5, .temperature = 2.0, .regression_weight = 1}),
      "kd_loss: regression_weight is 1.000000 but no student_regression and regression_targets "
      "were given",
      Error);
  CHECK_THROWS_WITH_AS(kd_loss(s, t, y, ok, tensor(kRegression)),
                       "kd_loss: regression_targets is undefined but its counterpart is given",
                       Error);
  CHECK_THROWS_WITH_AS(kd_loss(s, t, y, ok, tensor(kRegression), tensor(kTargets).slice(1, 0, 1)),
                       "kd_loss: student_regression [2, 2] and regression_targets [2, 1] must "
                       "both be [2, K]",
                       Error);
}

TEST_CASE("Train.KdLoss.LabelSmoothingSharesAndHardDistillation") {
  const torch::Tensor logits = torch::tensor({{2.0, 0.5, -1.0}, {0.1, 0.2, 0.3}});
  const torch::Tensor labels = torch::tensor({0, 2}, torch::kLong);
  const torch::Tensor log_p = torch::log_softmax(logits, 1);
  // Label smoothing 0.3 over 3 classes: the label gets 0.8, the others 0.1.
  const KdLoss smoothed = supervised_loss(logits, labels, 0, 0.3);
  const double expected_smoothed =
      -(0.8 * log_p[0][0] + 0.1 * log_p[0][1] + 0.1 * log_p[0][2] + 0.1 * log_p[1][0] +
        0.1 * log_p[1][1] + 0.8 * log_p[1][2])
           .item<double>() /
      2;
  CHECK(smoothed.total.item<double>() == doctest::Approx(expected_smoothed).epsilon(1e-6));
  // Shares of the classes (a mixed row): the cross-entropy against them.
  const torch::Tensor shares = torch::tensor({{0.7, 0.3, 0.0}, {0.0, 0.0, 1.0}});
  const KdLoss mixed = supervised_loss(logits, shares);
  CHECK(mixed.total.item<double>() ==
        doctest::Approx(-(0.7 * log_p[0][0] + 0.3 * log_p[0][1] + log_p[1][2]).item<double>() / 2)
            .epsilon(1e-6));
  // Hard distillation: the cross-entropy against the teacher's top class, here 1 and 0; with a
  // distillation head it goes there, and the logits learn the labels only.
  const torch::Tensor teacher = torch::tensor({{0.0, 5.0, 1.0}, {3.0, 0.0, 0.0}});
  const torch::Tensor head = torch::tensor({{1.0, 1.0, 0.0}, {0.0, 2.0, 1.0}}, torch::requires_grad());
  const torch::Tensor student = logits.clone().requires_grad_();
  const KdLoss hard =
      kd_loss(student, teacher, labels,
              {.alpha = 0.5, .temperature = 4, .distillation = Distillation::kHard}, {}, {}, head);
  const torch::Tensor head_log_p = torch::log_softmax(head, 1);
  CHECK(hard.kd.item<double>() ==
        doctest::Approx(-(head_log_p[0][1] + head_log_p[1][0]).item<double>() / 2).epsilon(1e-6));
  CHECK(hard.total.item<double>() ==
        doctest::Approx(0.5 * hard.ce.item<double>() + 0.5 * hard.kd.item<double>()).epsilon(1e-6));
  hard.total.backward();
  // The student's logits get the label term's gradient only: softmax - one-hot, times 0.5 / 2.
  const torch::Tensor expected_grad =
      (torch::softmax(logits, 1) - torch::one_hot(labels, 3).to(torch::kFloat)) * 0.25;
  CHECK(torch::allclose(student.grad(), expected_grad, 1e-6, 1e-6));
  CHECK(head.grad().abs().sum().item<double>() > 0);
}
