#pragma once

#include <torch/types.h>

#include <functional>
#include <vector>

#include "stages/train/pipeline_schedule.hpp"
#include "stages/train/vit.hpp"

namespace flowtrain::train {

/// One pipeline stage of a partitioned model: from its input (the images for the first
/// stage, the previous stage's output otherwise) to its output; the last stage's output is the
/// micro-batch's loss, a scalar averaged over its samples.
using PipelineStageFn = std::function<torch::Tensor(const torch::Tensor& input, int microbatch)>;

/// What one batch through a pipeline did, as measured.
struct PipelineBatchResult {
  std::vector<double> losses;  // [microbatch]: each micro-batch's loss (before the 1/M scale)
  double loss = 0;             // their weighted sum: the batch's loss
  double wall_s = 0;
  /// Each rank's actions as they ran: start (once the input had arrived) and end in seconds
  /// from the batch's start ([rank][i], in schedule order), for the pipeline chart.
  std::vector<std::vector<std::pair<double, double>>> spans;
  double bubble = 0;                // 1 - busy / (ranks x wall): the ranks' idle share
  std::vector<int> peak_in_flight;  // [stage]: most micro-batches whose activations it kept
};

/// Runs the forward and backward of one batch through `stages` as `schedule` orders them, in
/// one process: one thread per rank, each running its actions in order on `intraop_threads`
/// ATen threads, activations and their gradients handed between stages in memory. A stage keeps
/// a micro-batch's activations from its forward to its backward only. Each micro-batch's loss is
/// scaled by 1/M before its backward, so the gradients accumulated in the parameters' `grad`
/// are those of the mean loss over the batch (with micro-batches of equal size), as
/// torch.distributed.pipelining computes them; the caller then steps its optimizer once.
/// `input(m)` gives micro-batch m's input to the first stage; `weights[m]` (default 1/M) scales
/// its loss instead of 1/M, n_m / B for micro-batches of unequal sizes n_m (the loss is then
/// the batch's mean whatever the split). An exception in any stage stops
/// every rank and is rethrown as Error naming the rank, the stage, the micro-batch and the reason.
///
///   const PipelineSchedule schedule = make_pipeline_schedule(PipelineScheduleKind::k1F1B, 2, 4);
///   const std::vector<PipelineStageFn> stages = vit_pipeline_stages(model, {2}, loss_of);
///   const PipelineBatchResult r = run_pipeline_batch(schedule, stages, input_of, 1);
///   optimizer.step();
PipelineBatchResult run_pipeline_batch(const PipelineSchedule& schedule,
                                       const std::vector<PipelineStageFn>& stages,
                                       const std::function<torch::Tensor(int)>& input,
                                       int intraop_threads = 1,
                                       const std::vector<double>& weights = {});

/// A ViT split into pipeline stages at block indices `splits` (ascending, within 1 .. depth -
/// 1): the first stage embeds the images and runs the blocks before splits[0], the next ones
/// the blocks up to each next split, the last the rest, the head and `loss(output, m)`.
///   vit_pipeline_stages(model, {2}, loss)   // depth 4: [embed, blocks 0-1], [blocks 2-3, head]
std::vector<PipelineStageFn> vit_pipeline_stages(
    ViT& model,
    const std::vector<int>& splits,
    std::function<torch::Tensor(const ModelOutput&, int)> loss);

/// Split points that give `stages` stages of a ViT of `depth` blocks as equal a share of the
/// blocks as they divide: {2} for depth 4 and 2 stages, {4, 8} for depth 12 and 3.
std::vector<int> balanced_splits(int depth, int stages);

}  // namespace flowtrain::train
