#include "coordinator/survivor_round.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pipetrain::coordinator {

SurvivorRound::SurvivorRound(int ranks, int stages)
    : stages_(std::max(1, stages)),
      reports_(static_cast<size_t>(std::max(0, ranks))),
      layers_(static_cast<size_t>(std::max(0, ranks))),
      gone_(static_cast<size_t>(std::max(0, ranks)), false) {}

void SurvivorRound::Report(int rank, const recovery::CommitState& state, std::vector<int> layers) {
  if (rank < 0 || rank >= static_cast<int>(reports_.size()) || gone_[rank] || decided_ ||
      reports_[rank]) {
    return;
  }
  reports_[rank] = state;
  layers_[rank] = std::move(layers);
}

void SurvivorRound::Gone(int rank) {
  if (rank < 0 || rank >= static_cast<int>(gone_.size()) || reports_[rank] || decided_) return;
  gone_[rank] = true;
}

bool SurvivorRound::reported(int rank) const {
  return rank >= 0 && rank < static_cast<int>(reports_.size()) && reports_[rank].has_value();
}

int SurvivorRound::reports() const {
  int n = 0;
  for (const auto& report : reports_) n += report.has_value() ? 1 : 0;
  return n;
}

bool SurvivorRound::AllAccounted() const {
  for (size_t r = 0; r < reports_.size(); ++r) {
    if (!reports_[r] && !gone_[r]) return false;
  }
  return true;
}

void SurvivorRound::Decide() {
  if (decided_) return;
  decided_ = true;
  std::vector<recovery::Survivor> survivors;
  std::vector<int> rank_of;  // survivor index -> rank
  for (size_t r = 0; r < reports_.size(); ++r) {
    if (!reports_[r]) continue;
    const int rank = static_cast<int>(r);
    survivors.push_back({rank % stages_, rank / stages_, *reports_[r]});
    rank_of.push_back(rank);
  }
  // A stage none of whose replicas reported: say what became of each, rather than that
  // none survived (a rank that did not report in time may be alive).
  std::vector<std::string> unreported;
  for (int stage = 0; stage < stages_; ++stage) {
    std::vector<int> gone, silent;
    bool any = false;
    for (size_t r = static_cast<size_t>(stage); r < reports_.size(); r += stages_) {
      if (reports_[r]) any = true;
      (gone_[r] ? gone : silent).push_back(static_cast<int>(r));
    }
    if (any) continue;
    std::vector<std::string> what;
    if (!gone.empty()) {
      what.push_back(absl::StrCat(gone.size() == 1 ? "rank " : "ranks ", absl::StrJoin(gone, ", "),
                                  gone.size() == 1 ? " was" : " were",
                                  " lost or ended without a report"));
    }
    if (!silent.empty()) {
      what.push_back(absl::StrCat(silent.size() == 1 ? "rank " : "ranks ",
                                  absl::StrJoin(silent, ", "), " did not report in time"));
    }
    unreported.push_back(
        absl::StrCat("no replica of stage ", stage, " reported (", absl::StrJoin(what, "; "), ")"));
  }
  if (!unreported.empty()) {
    why_not_ = absl::StrCat(absl::StrJoin(unreported, "; "), "; ", reports(), " of ",
                            reports_.size(), " ranks reported");
    return;
  }
  absl::StatusOr<recovery::SurvivorPlan> plan = recovery::PlanSurvivorStep(survivors, stages_);
  if (!plan.ok()) {
    why_not_ = std::string(plan.status().message());
    return;
  }
  applies_held_.assign(reports_.size(), false);
  writes_.assign(reports_.size(), false);
  for (int i : plan->apply_held) applies_held_[rank_of[i]] = true;
  for (int i : plan->sources) writes_[rank_of[i]] = true;
  holds_.assign(reports_.size(), false);
  for (size_t r = 0; r < reports_.size(); ++r) {
    holds_[r] = reports_[r] && (reports_[r]->next_step == plan->step || applies_held_[r]);
  }
  plan_ = *std::move(plan);
}

void SurvivorRound::Abandon(const std::string& why) {
  if (decided_) return;
  decided_ = true;
  why_not_ = why;
}

std::optional<double> SurvivorRound::held_loss() const {
  if (!plan_) return std::nullopt;
  for (const std::optional<recovery::CommitState>& s : reports_) {
    if (s && s->held_step == plan_->step - 1 && s->held_loss) return s->held_loss;
  }
  return std::nullopt;
}

bool SurvivorRound::holds(int rank) const {
  return plan_ && rank >= 0 && rank < static_cast<int>(holds_.size()) && holds_[rank];
}

std::map<int, std::vector<int>> SurvivorRound::Holders() const {
  std::map<int, std::vector<int>> out;
  for (size_t r = 0; r < reports_.size(); ++r) {
    if (!holds(static_cast<int>(r))) continue;
    for (int layer : layers_[r]) out[layer].push_back(static_cast<int>(r));
  }
  return out;
}

v1::SurvivorInstruction SurvivorRound::InstructionFor(int rank) const {
  v1::SurvivorInstruction out;
  if (!decided_) {
    out.set_action(v1::SurvivorInstruction::WAIT);
    return out;
  }
  if (!plan_ || !reported(rank)) {
    out.set_action(v1::SurvivorInstruction::ABANDON);
    out.set_reason(plan_ ? "this rank's report came after the survivors' plan" : why_not_);
    return out;
  }
  out.set_action(v1::SurvivorInstruction::GO_ON);
  out.set_step(plan_->step);
  out.set_apply_held_update(applies_held_[rank]);
  out.set_write_state(writes_[rank]);
  out.set_hold_state(holds(rank) && !layers_[rank].empty());
  return out;
}

}  // namespace pipetrain::coordinator
