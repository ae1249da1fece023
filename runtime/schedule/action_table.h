// A value for every action of one step of a schedule's lists, by (kind, stage, micro-batch):
// what the checkers and simulators of one-step lists (compute_lists.h, communication.h)
// record as they walk the lists. Dense: a flat array of kinds x stages x micro-batches, read
// and written in constant time (the planners build a schedule for every layout they score).
//
// Not thread-safe (a value type: each walk owns its table). An action outside the table
// (Fits false: no stage number, or a stage or micro-batch out of range) must not be read or
// written; callers check it first.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "runtime/schedule/action.h"

namespace pipetrain::schedule {

template <typename T>
class ActionTable {
  static_assert(!std::is_same_v<T, bool>, "std::vector<bool> has no references: use char");

 public:
  // Every action of `stages` model stages on micro-batches 0 .. micro_batches − 1, each
  // holding `unset` (none where either count is below 1).
  ActionTable(int stages, int64_t micro_batches, T unset)
      : stages_(std::max(0, stages)),
        micro_batches_(std::max<int64_t>(0, micro_batches)),
        values_(static_cast<size_t>(kKinds) * stages_ * micro_batches_, unset) {}

  bool Fits(const Action& a) const {
    return a.stage >= 0 && a.stage < stages_ && a.index >= 0 && a.index < micro_batches_;
  }
  // REQUIRES: the action Fits.
  const T& Get(ActionKind kind, int stage, int64_t micro_batch) const {
    return values_[Slot(kind, stage, micro_batch)];
  }
  const T& Get(const Action& a) const { return Get(a.kind, a.stage, a.index); }
  void Set(const Action& a, T value) { values_[Slot(a.kind, a.stage, a.index)] = value; }

 private:
  static constexpr int kKinds = static_cast<int>(ActionKind::kOptimizerStep) + 1;
  size_t Slot(ActionKind kind, int stage, int64_t micro_batch) const {
    return (static_cast<size_t>(kind) * stages_ + stage) * micro_batches_ + micro_batch;
  }

  int stages_;
  int64_t micro_batches_;
  std::vector<T> values_;
};

}  // namespace pipetrain::schedule
