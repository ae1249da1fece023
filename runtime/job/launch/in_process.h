// Runs a job in this process: one thread per (replica, stage) over the in-process transport.
//
// The runner plans the job, builds each stage's own layers (never a whole-model copy beside
// them; explicit ranges or a balanced split), gives each stage its weight store (one version, or
// two for 2BW), its schedule and its data (stage 0 reads inputs, the last stage reads targets, both
// from the same deterministic sampler), runs all stages to the end and gathers the report.
// The un-pipelined reference it is checked against is runtime/job/reference.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/control/step_commands.h"
#include "runtime/job/job_spec.h"
#include "runtime/job/launch/stopped_rank.h"
#include "runtime/job/report/report.h"
#include "runtime/transport/transport.h"

namespace pipetrain::job {

struct RunOptions {
  // Called from a stage thread after each finished step, in step order.
  std::function<void(const Progress&)> on_progress;
  // Wraps each stage's transport, e.g. with a fault-injecting one in tests.
  std::function<std::unique_ptr<transport::Transport>(std::unique_ptr<transport::Transport>,
                                                      int stage)>
      wrap_transport;
  // Step commands for the run (runtime/control), read by stage 0 of replica 0; may be filled
  // before the run or while it runs.
  std::shared_ptr<control::StepCommandQueue> commands;
  // Called when the run failed, before its ranks are destroyed, with each of them,
  // replica-major (index replica * ranks + rank): what going on from the survivors of a
  // fault takes (runtime/recovery; tests).
  std::function<void(const std::vector<StoppedRank>&)> on_failure;
  Generation generation;  // every rank's
};

// Validates the job fully (including the partition against the model's layers) and runs it.
// The first error of any stage stops every stage and is returned.
absl::StatusOr<JobReport> RunInProcess(const JobSpec& config, const RunOptions& options = {});

}  // namespace pipetrain::job
