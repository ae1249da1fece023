// What a rank of a job with the step commit (StageAssignment.commit_steps) does once its run
// failed, before its state is gone (job::StageListener::Stopped): it tells the
// coordinator where its weights stand (CoordinatorService.ReportStopped), asks again while
// the answer is WAIT (every kSurvivorPoll, until the earliest deadline any WAIT named, and 5
// minutes at most), and carries out
// its answer: GO_ON applies the held update if told; if told, keeps the rank's layers in
// `held` for the next generation's ranks to take (held_state.h); and, if told, writes the
// rank's state as the checkpoint before the survivors' step through the job's store
// (job::DeliverStoppedRank); ABANDON does nothing. Never waits without a deadline: the
// coordinator out of reach (kAttempts calls without an answer) or the worker closing gives
// up, and the job restarts from its last checkpoint as it would have without the commit.
//
// Thread-compatible: called on the stage's thread; `closing` may be called from it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/time/time.h"
#include "pipetrain/v1/worker_service.pb.h"
#include "runtime/job/job_spec.h"
#include "runtime/job/launch/stopped_rank.h"
#include "worker/coordinator_client.h"
#include "worker/held_state.h"

namespace pipetrain::worker {

// What the rank's StageEnd says of it (StageEnd.survivor_*).
struct SurvivorOutcome {
  std::string checkpoint;  // the checkpoint's directory, if this rank committed it
  int64_t step = -1;       // the survivors' step, when this rank wrote its state
  std::string failed;      // why its part failed, when it was told to write and could not
};

inline constexpr absl::Duration kSurvivorPoll = absl::Milliseconds(100);
inline constexpr int kSurvivorAttempts = 3;

SurvivorOutcome HandOffSurvivor(CoordinatorClient& coordinator,
                                const v1::StageAssignment& assignment, const std::string& worker_id,
                                const job::JobSpec& config, const job::StoppedRank& stopped,
                                const std::function<bool()>& closing, HeldStates* held = nullptr);

}  // namespace pipetrain::worker
