// One generation's round of survivors: after a rank of a job that commits its steps
// (StageAssignment.commit_steps) failed or was lost, the ranks whose runs stopped report
// where their weights stand (CoordinatorService.ReportStopped), and once every rank is
// accounted for (reported, lost, or ended without a report) or the deadline passed, the
// round decides, once: the newest step every place of the pipeline has a survivor at
// (runtime/recovery/survivor_step.h), who applies its held update first, and who writes its
// state as the checkpoint before that step (one replica per place); or why the job restarts
// from its last checkpoint instead (a place no replica of survived, a rank outside the
// pipeline, the round given up).
//
//   open --Report/Gone--> open --Decide (all accounted, or deadline)--> decided
//   open --Abandon(why)--> decided (abandoned)
//
// Pure: no clock (the caller says when the deadline passed), no I/O. Thread-compatible (the
// coordinator holds its lock).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "pipetrain/v1/coordinator_service.pb.h"
#include "runtime/recovery/survivor_step.h"

namespace pipetrain::coordinator {

class SurvivorRound {
 public:
  // A generation of `ranks` ranks, `stages` of them per pipeline (rank = replica * stages +
  // stage).
  SurvivorRound(int ranks, int stages);

  // Rank `rank` stopped with its weights at `state`, holding the model's `layers` (global
  // indices). The first report counts; one for a rank already gone, or out of range, changes
  // nothing.
  void Report(int rank, const recovery::CommitState& state, std::vector<int> layers = {});
  // Rank `rank` will not report: its worker was lost, or its stage ended without a report.
  void Gone(int rank);
  bool reported(int rank) const;
  // How many ranks have reported.
  int reports() const;
  // Every rank reported or is gone.
  bool AllAccounted() const;

  // Decides from the reports (no change once decided).
  void Decide();
  // Decides that the survivors do not go on: `why` (no change once decided).
  void Abandon(const std::string& why);
  bool decided() const { return decided_; }
  // Once decided: the plan, or nullopt with why_not().
  const std::optional<recovery::SurvivorPlan>& plan() const { return plan_; }
  const std::string& why_not() const { return why_not_; }
  // With a plan: the loss of mini-batch plan()->step − 1 as a survivor of a last stage held it
  // with its update (its commit began and did not end), if one did.
  std::optional<double> held_loss() const;
  // With a plan: whether rank `rank` stands at the plan's step once it applied its held
  // update, if told (so holds the state the next generation starts from).
  bool holds(int rank) const;
  // With a plan: each layer, by the ranks that hold it (ascending) among those that do.
  std::map<int, std::vector<int>> Holders() const;

  // What rank `rank` is told: WAIT before the decision; then GO_ON (the plan's step, and
  // whether this rank applies its held update and writes its state) for a survivor that
  // reported, or ABANDON with why. A survivor that holds() its layers is told to hold them
  // for the next generation (hold_state; the key and for how long are the caller's).
  v1::SurvivorInstruction InstructionFor(int rank) const;

 private:
  int stages_;
  std::vector<std::optional<recovery::CommitState>> reports_;  // per rank
  std::vector<std::vector<int>> layers_;                       // per rank, as reported
  std::vector<bool> gone_;
  bool decided_ = false;
  std::optional<recovery::SurvivorPlan> plan_;
  std::string why_not_;
  // With a plan: per rank, whether it applies its held update / writes its state.
  std::vector<bool> applies_held_, writes_, holds_;
};

}  // namespace pipetrain::coordinator
