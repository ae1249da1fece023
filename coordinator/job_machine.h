// A job's lifecycle as a pure state machine: Apply(run, event, policy) -> (run, commands).
//
//   queued --GenerationStarted--> running --StageEnded(failed)--> held failure
//   running/held failure --(every rank ended | PeersAlive | RankLost | Fault)--> recovering,
//       when restarts are left (else failed); --(every rank ended, none failed)--> succeeded
//   recovering --GenerationStarted--> running;  --RecoveryTimedOut--> failed
//   running/held failure --Unplaceable--> queued (a placement failure costs no restart)
//   any but a final state --CancelRequested--> cancelled
//
// A rank's failure is *held* (phase kHeldFailure) rather than made the job's at once: when a
// worker dies its peers fail first ("lost stage 1"), and the job's cause must name the dead
// worker, not a survivor. It becomes the job's once the other workers show they are alive
// (PeersAlive, from the coordinator's monitor), or once every rank has ended; a worker lost
// meanwhile (RankLost) is the cause instead, and so is a later failure that was not itself a
// consequence of a peer's (failed_after_peer) when the held one was.
//
// The machine decides; the job's controller (job_controller.h) carries out the commands in
// order: stop the ranks still running, record a recovery, end the job, requeue it, say something in
// the job's events, mark a rank's stage. Events that do not apply in the run's phase (a stage end
// after the job ended, a report of an old generation) change nothing and command nothing.
//
// Pure: no clock (times come in events), no I/O, no locks. Thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "absl/time/time.h"

namespace pipetrain::coordinator {

enum class Phase {
  kQueued,
  kRunning,
  kHeldFailure,  // running, a rank's failure held back (see above)
  kRecovering,   // a fault ended the last generation; the next is not placed yet
  kSucceeded,
  kFailed,
  kCancelled,
};
// "queued", "running", "held failure", "recovering", "succeeded", "failed", "cancelled".
const char* PhaseName(Phase phase);
bool IsFinal(Phase phase);
// Ranks run (or are being stopped) in it: the job's state is "running".
bool IsRunning(Phase phase);

struct RestartPolicy {
  int max_restarts = 0;  // generations a fault may end before the job fails
};

// What the machine knows of a job.
struct JobRun {
  Phase phase = Phase::kQueued;
  int64_t generation = 0;        // numbered from 1; 0 before the first
  int restarts = 0;              // generations ended by a fault so far
  std::vector<bool> rank_ended;  // of the current generation
  // kHeldFailure: the first rank failure ("stage 1 on worker-2 failed: ..."), since when,
  // and whether it said it was the consequence of another rank's.
  std::string held_failure;
  bool held_after_peer = false;
  absl::Time held_since;
  int64_t stop_step = 0;  // a stop command's boundary, once scheduled in this generation
};

// ---- Events
struct GenerationStarted {  // placed: `ranks` ranks assigned, generation + 1 runs
  int ranks = 0;
};
struct StageEnded {  // a rank of the current generation reported its end
  int rank = 0;
  bool ok = true;
  bool failed_after_peer = false;
  std::string failure;  // !ok: "stage 1 on worker-2 failed: <cause>"
  absl::Time at;
};
struct RankLost {  // the worker of a rank of the current generation is gone
  int rank = 0;
  std::string cause;  // "worker-3 (host:port) running stage 1 stopped sending heartbeats ..."
};
struct PeersAlive {};  // every worker of a rank still running has heartbeated since the hold
struct Fault {         // the generation ends for a cause that is not one rank's end
  std::string cause;   // a drained worker's checkpoint is the restart point; a restart; ...
  int rank = -1;       // a rank that ended with it (an assignment refused), or -1
};
struct Unplaceable {  // a rank could not be placed on any worker: back to the queue
  int rank = 0;
  std::string why;
};
struct StopScheduled {  // a stop command takes effect before `step`
  int64_t step = 0;
};
struct RecoveryTimedOut {  // no layout found for the next generation in time
  std::string message;
};
struct CancelRequested {};
using JobEvent = std::variant<GenerationStarted, StageEnded, RankLost, PeersAlive, Fault,
                              Unplaceable, StopScheduled, RecoveryTimedOut, CancelRequested>;

// ---- Commands, carried out by the coordinator in the order given
struct StopRanks {  // tell the workers of these ranks (those not ended) to stop their stages
  std::string reason;
  std::vector<int> ranks;
};
enum class StageMark { kDone, kFailed, kLost };
struct MarkStage {
  int rank = 0;
  StageMark mark = StageMark::kDone;
};
struct Announce {  // an event of the job
  std::string text;
};
struct BeginRecovery {  // restart number run.restarts: record it, run again from the checkpoint
  std::string cause;
  // A rank failed or was lost: the ranks that survived may go on from their newest common
  // step (coordinator/survivor_round.h). Not after a Fault: a drain's checkpoint, a
  // coordinator restart, a refused assignment name their own restart point.
  bool survivors = true;
};
struct EndJob {  // the job ended in run.phase (a final one) with this message
  std::string message;
};
struct Requeue {  // the job waits in the queue again, saying why
  std::string why;
};
using JobCommand = std::variant<StopRanks, MarkStage, Announce, BeginRecovery, EndJob, Requeue>;

struct Transition {
  JobRun run;
  std::vector<JobCommand> commands;
};

Transition Apply(JobRun run, const JobEvent& event, const RestartPolicy& policy);

}  // namespace pipetrain::coordinator
