// A rank whose run failed, as it stands once its Run() has returned and before its state is
// destroyed: what going on from the survivors of a fault takes (runtime/recovery), handed to
// the hooks of every launch mode (RunOptions::on_failure, StageListener::Stopped).
// Valid only during the hook's call; not thread-safe (the rank's own thread, or after it
// joined).
#pragma once

#include <functional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "runtime/model/stage_module.h"
#include "runtime/recovery/survivor_step.h"
#include "runtime/weights/weight_store.h"

namespace pipetrain::job {

struct StoppedRank {
  // Why its run failed. One rank through RunStage: attributed as RunStage returns it (a rank
  // that failed after another leads with the first's error, kFailedAfterPeerPayload).
  absl::Status error;
  recovery::CommitState state;  // executor::StageExecutor::commit_state()
  // (model stage, its weights) for each model stage the rank holds, in model order.
  std::vector<std::pair<int, weights::WeightStore*>> model_stages;
  // The model's layers each of those holds (global indices), in the same order.
  std::vector<model::LayerRange> layers;
  // Applies the update the rank holds (executor::StageExecutor::ApplyHeldUpdate).
  std::function<absl::Status()> apply_held_update;
};

}  // namespace pipetrain::job
