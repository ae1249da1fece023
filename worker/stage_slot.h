// The one rank a worker runs at a time, and everything that may happen to it:
//
//   free --Start--> running --MarkEnded--> ending (its end being reported) --Release--> free
//   running --Stop/StopAny--> running, told to stop (the first reason is kept)
//   Close: no new rank from then on (the worker drains or stops)
//
// A stop reaches the stage through the stopper its host installs once the stage has one (its
// transport, then its executor); a stop asked for before that is applied the moment it is
// installed, so no stop is lost to a stage still being built. A stop for another job, or for
// another generation of the job (one sent before this rank was assigned), leaves it alone.
//
// Start runs the rank's body on a thread of its own. A rank on its way out (ending, or told to
// stop) is waited for rather than refused: the coordinator counts the worker idle from its
// stage's end, so the next assignment may arrive first. The same assignment again (a retried
// call) is accepted without starting anything.
//
// Time comes from an injected Clock: a wait ends once the clock passes its deadline (looked at
// every kClockPoll at least), so tests drive it with a FakeClock.
//
// Thread-safe. The stopper and the activity source are called under the slot's lock: they
// must not call back into the slot.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "runtime/base/clock.h"
#include "runtime/control/step_commands.h"

namespace pipetrain::worker {

class StageSlot {
 public:
  static constexpr absl::Duration kClockPoll = absl::Milliseconds(50);

  // The rank that runs (job_id "" when free).
  struct Occupant {
    std::string job_id;
    int rank = -1;
    int64_t generation = 0;
    bool ending = false;      // its stage has ended; its end is being reported
    std::string stop_reason;  // why it was told to stop; "" if it was not
  };
  // What the stage does now and what it waits for (its executor's), for heartbeats.
  struct Activity {
    std::string action;
    std::string waiting_for;
  };

  explicit StageSlot(std::shared_ptr<const Clock> clock);
  ~StageSlot();  // Shutdown

  // Runs `body` on a thread of its own as rank `rank` of `job_id`'s generation `generation`.
  // Waits (up to `patience` on the clock) for a rank on its way out. OK, starting nothing,
  // for the very rank that runs (not told to stop: a retried assignment); FailedPrecondition
  // while another rank runs; Unavailable once closed (the reason given to Close).
  absl::Status Start(const std::string& job_id, int rank, int64_t generation,
                     absl::Duration patience, std::function<void()> body);
  // Tells the running rank to stop if it is of `job_id` and `generation` (0: any generation).
  void Stop(const std::string& job_id, int64_t generation, const std::string& why);
  // Tells whatever rank runs to stop.
  void StopAny(const std::string& why);
  // No rank starts from now on; Start says `why`.
  void Close(const std::string& why);

  // ---- Called by the stage's host, on the stage's thread.
  // How to stop the stage (its transport's Abort, then its executor's Stop); null when it
  // has none any more. A stop already asked for is applied at once.
  void SetStopper(std::function<void(const absl::Status&)> stop);
  void SetActivitySource(std::function<Activity()> activity);
  // Rank 0: where step commands for its stage go (null once the stage no longer takes them).
  void SetCommandQueue(std::shared_ptr<control::StepCommandQueue> commands);
  // The stage has ended: stops no longer apply. Returns why it was told to stop ("" if not).
  std::string MarkEnded();
  // Last, once its end is reported: the slot is free.
  void Release();

  // ---- Anyone.
  Occupant occupant() const;
  // Close was called: no rank starts any more (the worker drains or stops).
  bool closed() const;
  Activity activity() const;
  // The command queue of rank 0 of `job_id`, if that runs here and was not told to stop.
  std::shared_ptr<control::StepCommandQueue> CommandQueueOf(const std::string& job_id) const;
  // Waits until no rank of `job_id` runs here, or the clock passes `deadline`; true if none.
  bool WaitUntilNotRunning(const std::string& job_id, absl::Time deadline);
  // Close(why), StopAny(why), and waits for the stage's thread to end (the worker stops).
  void Shutdown(const std::string& why);

 private:
  // Waits until `done` holds (under mu_) or the clock passes `deadline`; whether it holds.
  bool AwaitUntil(const std::function<bool()>& done, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StopLocked(const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<const Clock> clock_;
  mutable absl::Mutex mu_;
  Occupant occupant_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::string closed_because_ ABSL_GUARDED_BY(mu_);
  std::function<void(const absl::Status&)> stopper_ ABSL_GUARDED_BY(mu_);
  std::function<Activity()> activity_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<control::StepCommandQueue> commands_ ABSL_GUARDED_BY(mu_);
  std::thread thread_ ABSL_GUARDED_BY(mu_);  // the last rank's; joined before the next starts
};

}  // namespace pipetrain::worker
