// Weight versions of one pipeline stage (docs/design.md section 4.3).
//
// SingleVersionWeights (GPipe, 1F1B-Flush, and the schedules with chunks): one version;
// Update(t) applies mini-batch t's accumulated gradient after the flush.
// DoubleBufferedWeights (PipeDream-2BW): micro-batch j runs on version max(floor(j/m)-1, 0);
// version v lives in buffer v % 2. Update(t), called right after the stage's last backward
// of mini-batch t, computes W(t+1) = W(t) - step(grad of mini-batch t, which was
// accumulated on W(t-1)) into the buffer that held W(t-1). A request for a version that is
// no longer held is an Internal error, never a silent use of the wrong weights.
// UseNewestFrom(N) (a weight-version switch at a drained boundary, runtime/control) restarts
// the rule at N: from mini-batch N on, micro-batch j runs on version max(floor(j/m)-1, N).
// Not thread-safe: owned and used by one stage thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "runtime/model/stage_module.h"
#include "runtime/weights/optimizer.h"

namespace pipetrain::weights {

// Whether every element of every tensor is finite (CPU float32/float64 read in one pass,
// without allocating; other tensors by ATen reductions answered together).
bool AllFinite(const std::vector<at::Tensor>& tensors);

class WeightStore {
 public:
  virtual ~WeightStore() = default;
  // The module that micro-batch j's forward and backward run on.
  virtual absl::StatusOr<model::StageModule*> ModuleFor(int64_t micro_batch) = 0;
  virtual int64_t VersionFor(int64_t micro_batch) const = 0;
  // Micro-batch j runs on version `version` (PipeDream's vertical sync: the version stage 0
  // ran it on), before its first ModuleFor(). Only a stashing store made with
  // `versions_given` keeps the versions for that; Internal error otherwise, or if the
  // version is not held or j already runs on another.
  virtual absl::Status RunOn(int64_t micro_batch, int64_t version) {
    (void)micro_batch;
    (void)version;
    return absl::InternalError("this store runs every micro-batch on the version it chooses");
  }
  // Applies mini-batch t's gradient (as the parameters of ModuleFor(t's micro-batches) hold
  // it: the caller averages it over replicas and sums tied copies first, in place) at update
  // t's learning rate (the optimizer's schedule) and folds its BatchNorm statistics. If any
  // gradient is not finite, the step is skipped instead: the weights, BatchNorm statistics and
  // optimizer state stay as they were (2BW: W(t+1) = W(t)), the gradients are cleared, and
  // last_update_skipped() is true. A non-finite loss makes every gradient upstream of it
  // non-finite, and the replicas' average is non-finite if any replica's is, so every stage of
  // every replica skips the same step (docs/design.md section 4.7).
  virtual absl::Status Update(int64_t mini_batch) = 0;
  // The gradient of mini-batch t as Update(t) will apply it: a tensor per parameter of
  // Newest().OwnParameters(), each defined (zeros where a parameter took no part), for the
  // caller to change in place before Update(t) (the replicas' average, tied copies' sum).
  // REQUIRES: every backward of mini-batch t is done, none of a later one begun.
  virtual absl::StatusOr<std::vector<at::Tensor>> Gradients(int64_t mini_batch) = 0;
  // Adds the gradients of shared parameters (StageModule::ShareParameter) into their owners'
  // in every version it holds. Gradients() and Update() fold first themselves, which covers
  // owners in the same module; where a module shares another module's parameter, the rank
  // folds every store before any of them reads a gradient (the owner may update first).
  virtual void FoldSharedGradients() = 0;
  bool last_update_skipped() const { return last_skipped_; }
  // The newest weights (what a checkpoint or the final report reads).
  virtual const model::StageModule& Newest() const = 0;
  // The same, to run a forward-only pass on (an evaluation, under NoGradGuard): its caller
  // changes no weight and leaves it in training mode as it found it.
  virtual model::StageModule& MutableNewest() = 0;
  // The weight versions it holds now: a stashing store's modules, which under vertical sync
  // include versions kept for micro-batches still to come; 1 for the others (the executor
  // counts a double-buffered stage's by the micro-batches running on them).
  virtual int held_versions() const { return 1; }
  // Number of the newest version (0 before any update).
  virtual int64_t newest_version() const = 0;
  // The older version the next mini-batch (newest_version()) runs on where that is not
  // Newest(): 2BW's W(N-1) at boundary N without a switch; nullptr otherwise. A checkpoint
  // writes it beside Newest(), so that a job resumed from it continues the 1-step-stale
  // trajectory.
  virtual const model::StageModule* StaleForNext() const { return nullptr; }
  // From mini-batch `mini_batch` on, run on the newest weights at that boundary instead of
  // the previous version (2BW); the caller drains the pipeline there first. Must come before
  // any forward of that mini-batch, in increasing order. One version: nothing to do.
  virtual absl::Status UseNewestFrom(int64_t /*mini_batch*/) { return absl::OkStatus(); }
  // The optimizer's state, by position in Newest().OwnParameters() (a checkpoint's), and its
  // replacement (a resumed job's, before its first step).
  virtual std::vector<ParameterState> OptimizerState() const = 0;
  virtual absl::Status LoadOptimizerState(const std::vector<ParameterState>& state) = 0;

 protected:
  bool last_skipped_ = false;
};

// Every factory tells `optimizer` the kinds of `module`'s own parameters (weight decay's
// groups): share tied parameters before making the store.
// `module` holds version `start_version` (0; a resumed job's first step N: W(N)). A
// double-buffered store started at N > 0 runs mini-batch N on `stale` (W(N-1), what the
// checkpoint's StaleForNext() was) where given, else on W(N), as after a weight-version
// switch before N.
absl::StatusOr<std::unique_ptr<WeightStore>> MakeSingleVersionWeights(
    std::unique_ptr<model::StageModule> module, std::unique_ptr<Optimizer> optimizer,
    int64_t start_version = 0);

// PipeDream's weight stashing (schedule kPipeDream): a micro-batch's forward runs on the
// newest version there is when it starts, and its backward on the same one, kept until then;
// with `versions_given` (vertical sync, stages after the first) on the version RunOn() gives
// it instead, and since those never decrease, every version from the latest given on is kept;
// Update(t) sums mini-batch t's gradients over the versions its micro-batches ran on and
// makes version t + 1 from the newest (in a module of its own while micro-batches still run
// on the newest). Under 1F1B stage s holds at most p − s versions. The version a micro-batch
// runs on is fixed by its first ModuleFor().
absl::StatusOr<std::unique_ptr<WeightStore>> MakeStashedWeights(
    std::unique_ptr<model::StageModule> module, std::unique_ptr<Optimizer> optimizer,
    int micro_batches, int64_t start_version = 0, bool versions_given = false);

absl::StatusOr<std::unique_ptr<WeightStore>> MakeDoubleBufferedWeights(
    std::unique_ptr<model::StageModule> module, std::unique_ptr<Optimizer> optimizer,
    int micro_batches, int64_t start_version = 0,
    std::unique_ptr<model::StageModule> stale = nullptr);

// Gradients of `params` with undefined ones replaced by zeros of the parameter's shape.
std::vector<at::Tensor> GradientsOf(const std::vector<at::Tensor>& params);
// The same, the zeros made the parameters' own .grad: changing the result in place changes
// what an update reads.
std::vector<at::Tensor> DefinedGradients(const std::vector<at::Tensor>& params);

}  // namespace pipetrain::weights
