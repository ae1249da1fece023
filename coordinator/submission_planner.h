// Plans `stages: auto` jobs at submission: checks the model profile the CLI measured against
// the coordinator's bounds, plans for the workers it has (a snapshot its caller takes; on
// several hosts, for those hosts: planners.h), and
// returns the job with the chosen layout, its config and the plan's record. Planning cannot
// starve running jobs, the coordinator's state loop or its health: one plan at a time, on a
// thread of its own at the lowest CPU priority (nice 19), stopped past its CPU budget or time
// limit (DeadlineExceeded); at most kMaxWaitingPlans submissions wait for their turn (up to
// Options::wait), the rest are refused at once (ResourceExhausted).
//
// Thread-safe: its gate has a lock of its own, and it takes no lock of the coordinator's.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "pipetrain/v1/job.pb.h"
#include "pipetrain/v1/job_service.pb.h"
#include "runtime/job/job_spec.h"
#include "runtime/planner/planners.h"

namespace pipetrain::coordinator {

class SubmissionPlanner {
 public:
  struct Options {
    absl::Duration cpu_budget = absl::Seconds(10);
    absl::Duration time_limit = absl::Seconds(60);
    absl::Duration wait = absl::Seconds(30);
    // The links between hosts, as measured, for a profile without its own (not measured:
    // job_traffic.h's assumption).
    planner::HostLinks host_links;
  };
  // The planner's work is bounded: at most this large a profile, this many profiled layers
  // and sizes, and plans for at most this many workers (more are planned as this many).
  static constexpr size_t kMaxProfileBytes = size_t{16} << 20;
  static constexpr size_t kMaxPlannedLayers = 256;
  static constexpr size_t kMaxProfiledSizes = 8;
  static constexpr int kMaxPlannedWorkers = 16;
  static constexpr int kMaxWaitingPlans = 2;

  struct Planned {
    job::JobSpec spec;  // the submitted spec with the chosen layout
    v1::PlannedLayout record;
  };

  explicit SubmissionPlanner(Options options) : options_(options) {}

  // InvalidArgument for a missing or oversized profile or one of another model;
  // FailedPrecondition without workers; the planner's errors (ResourceExhausted: nothing
  // fits); and the gate's (above).
  absl::StatusOr<Planned> Plan(const job::JobSpec& spec, const std::string& profile_json,
                               const std::vector<v1::WorkerInfo>& workers);

 private:
  // planner::MakePlan through the gate.
  absl::StatusOr<planner::PlanResult> RunGated(const planner::ModelProfile& profile,
                                               const planner::ClusterProfile& cluster,
                                               planner::PlanRequest request);

  const Options options_;
  std::mutex mu_;
  std::condition_variable done_;
  bool busy_ = false;  // a plan runs
  int waiting_ = 0;    // submissions waiting for their turn
};

}  // namespace pipetrain::coordinator
