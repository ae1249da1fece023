// A job's pipeline layout: how many stages (and, when fixed, each one's layers), how many
// data-parallel replicas, and the micro-batching of a step. The one definition of the
// notion: a checkpoint's manifest records the layout it was written from
// (runtime/checkpoint/manifest.h), the coordinator chooses the layout a job restarts with
// among these (coordinator/placement.h RecoveryLayouts), and job::PipelineLayoutOf reads it
// from a job, and each layout the planners consider holds one (runtime/planner/predict.h
// planner::Layout, with the schedule, recomputation and the AllReduce beside it). A plain
// value; header-only.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace pipetrain::model {

struct PipelineLayout {
  int stages = 1;
  int replicas = 1;
  int micro_batches = 1;     // per step per replica
  int micro_batch_size = 1;  // rows per micro-batch
  // Each stage's layers [begin, end), contiguous from layer 0; empty where only the count is
  // fixed (the stages are then balanced when the job is planned).
  std::vector<std::pair<int, int>> stage_layers;

  int ranks() const { return stages * replicas; }
  // Rows per step: what a restart keeps, so that the data order and the arithmetic stay
  // the same.
  int64_t global_batch() const { return int64_t{replicas} * micro_batches * micro_batch_size; }
};

}  // namespace pipetrain::model
