#pragma once

#include "graph/registry.hpp"
#include "stages/data/batch.hpp"

namespace flowtrain::train {

/// Joins the batches that two or more branches made of one batch (the same batch number), each
/// through its own `teacher_infer`: the result is the first branch's batch with the teacher
/// outputs of all branches averaged, so `student_step` distils from the ensemble's mean.
///
///   - {type: teacher_infer, name: teacher_a, params: {model: a.pt}}
///   - {type: teacher_infer, name: teacher_b, inputs: collate, params: {model: b.pt}}
///   - {type: join, inputs: [teacher_a, teacher_b]}
///   - {type: student_step, ...}
class JoinTeachersStage final : public Join<data::Batch, data::Batch> {
 public:
  using Options = NoOptions;
  explicit JoinTeachersStage(const Options& = {}) {}
  static StageDoc describe();

 protected:
  std::optional<data::Batch> process(std::vector<data::Batch>&& parts, ItemContext& ctx) override;
};

}  // namespace flowtrain::train
