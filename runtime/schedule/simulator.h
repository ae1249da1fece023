// Dry-runs all stages' action lists together: the oracle for schedules and the planner.
//
// Model: each stage is one sequential processor executing its list in order. An action
// starts when the stage is free and, for RECV_*, when the matching SEND_* on the peer stage
// has finished plus the link latency. Sends never block. Durations come from a CostModel.
// Before simulating, the lists are checked: every F<j>/B<j> exactly once per stage for the
// same set of micro-batches on every stage, B<j> after F<j>, and every SEND matched by
// exactly one RECV on the neighbouring stage (activations s -> s+1, gradients s+1 -> s).
// Also checked: no negative indices, no duplicate action of any kind on a stage (STEP
// included), SEND_ACT<j> after F<j>, RECV_ACT<j> before F<j>, RECV_GRAD<j> before B<j>,
// SEND_GRAD<j> after B<j> (communication is optional; where present it must be so placed).
// Lists whose actions name their model stages (a schedule with chunks, as BuildSchedule
// lowers and checks them: communication.h) are simulated as they are, without those
// one-stage-a-rank checks: a RECV waits for the SEND of the adjacent model stage on
// whichever rank holds it, and I and W are actions like any other.
// Stateless and thread-safe.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/schedule/action.h"

namespace pipetrain::schedule {

struct CostModel {
  // Duration in seconds of `action` in the list of rank `stage` (the action names its model
  // stage where a rank holds several). Must be >= 0.
  std::function<double(int stage, const Action& action)> duration;
  // Added between the end of a SEND and the earliest end of its RECV.
  double link_latency_s = 0.0;

  // Every F costs t_f, every B t_b, everything else 0.
  static CostModel Uniform(double t_f, double t_b);
};

struct TimedAction {
  Action action;
  double start_s;
  double end_s;
};

struct SimulationResult {
  double makespan_s = 0;                           // end of the last action on any stage
  std::vector<std::vector<TimedAction>> timeline;  // per stage, in list order
  std::vector<int> peak_in_flight;                 // per stage: max over time of #F done - #B done
  std::vector<double> busy_s;                      // per stage: sum of durations
  // End time of STEP<t> per stage (index t) when the lists contain STEP actions; sized
  // max t + 1 per stage, -1 for a t with no STEP on that stage.
  std::vector<std::vector<double>> step_end_s;
};

// Structural checks only (the first paragraph above). InvalidArgument naming the stage and
// action on failure, e.g. "stage 1: SEND_ACT3 has no matching RECV_ACT3 on stage 2".
absl::Status CheckSchedule(const std::vector<std::vector<Action>>& stages);

// Runs CheckSchedule (lists of one stage a rank), then simulates. A deadlock is FailedPrecondition
// listing, for every stuck stage, the action it waits at and the peer it waits for
// ("deadlock: stage 1 waits at RECV_GRAD0 for stage 2; stage 2 waits at RECV_ACT1 for ...").
absl::StatusOr<SimulationResult> Simulate(const std::vector<std::vector<Action>>& stages,
                                          const CostModel& cost);

// Peak in-flight micro-batches of one stage's list: max over prefixes of #F - #B.
int PeakInFlight(const std::vector<Action>& actions);

// A text grid, one row per stage: "s0 | F0 F1 .. B0 ..", for golden tests and hang reports.
std::string FormatGrid(const std::vector<std::vector<Action>>& stages);

}  // namespace pipetrain::schedule
