#include "stages/train/inference/join_teachers.hpp"

#include <torch/torch.h>

#include "graph/error.hpp"

namespace flowtrain::train {

namespace {

// The mean of one teacher output over the branches; every branch must have it, alike in shape.
at::Tensor mean_of(const std::vector<data::Batch>& parts, at::Tensor data::Batch::*field,
                   const char* what) {
  const bool first = (parts[0].*field).defined();
  std::vector<at::Tensor> all;
  for (std::size_t k = 0; k < parts.size(); ++k) {
    const at::Tensor& t = parts[k].*field;
    if (t.defined() != first) {
      throw Error(std::string("branch ") + std::to_string(k + 1) + (t.defined() ? " has " : " lacks ") +
                  what + " that branch 1 " + (first ? "has" : "lacks") +
                  "; join the outputs of teacher_infer stages with the same kind of model");
    }
    if (first && !t.sizes().equals((parts[0].*field).sizes())) {
      throw Error(std::string(what) + " of branch " + std::to_string(k + 1) + " have shape " +
                  c10::str(t.sizes()) + ", branch 1's " + c10::str((parts[0].*field).sizes()) +
                  "; the teachers must predict the same classes");
    }
    if (first) all.push_back(t);
  }
  if (!first) return {};
  // Summed in branch order, then divided: the same bits whatever the graph's timing.
  at::Tensor sum = all[0].clone();
  for (std::size_t k = 1; k < all.size(); ++k) sum.add_(all[k]);
  return sum.div_(static_cast<double>(all.size()));
}

}  // namespace

StageDoc JoinTeachersStage::describe() {
  return {"Joins the batches two or more branches made of one batch (the same batch number, "
          "each through its own teacher_infer): the first branch's batch with the teacher "
          "outputs of all branches averaged, a teacher ensemble for the student's loss.",
          {}};
}

std::optional<data::Batch> JoinTeachersStage::process(std::vector<data::Batch>&& parts,
                                                      ItemContext&) {
  for (std::size_t k = 1; k < parts.size(); ++k) {
    if (parts[k].number != parts[0].number || parts[k].size() != parts[0].size()) {
      throw Error("branch " + std::to_string(k + 1) + " brought batch " +
                  std::to_string(parts[k].number) + " of " + std::to_string(parts[k].size()) +
                  " rows for batch " + std::to_string(parts[0].number) + " of " +
                  std::to_string(parts[0].size()) + "; join branches of one collate");
    }
  }
  at::Tensor logits = mean_of(parts, &data::Batch::teacher_logits, "teacher logits");
  at::Tensor regression = mean_of(parts, &data::Batch::teacher_regression, "teacher regression");
  data::Batch out = std::move(parts[0]);
  out.teacher_logits = std::move(logits);
  out.teacher_regression = std::move(regression);
  return out;
}

FLOWTRAIN_REGISTER_STAGE("join", JoinTeachersStage);

}  // namespace flowtrain::train
