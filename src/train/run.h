// The training run: the loop over steps (Trainer::step), metrics, TensorBoard, periodic evaluation and
// checkpoints, Ctrl-C, and the end-of-run report.
#pragma once

#include "train/checkpoint.h"
#include "train/options.h"

namespace anvil {

// Runs training to completion; returns the process exit status (0, or 130 when interrupted after saving).
// `resume` is the checkpoint to continue (read once by the caller), or null.
int run_train(TrainOptions opts, const ResumePoint* resume = nullptr);

}  // namespace anvil
