// The one list of schedules (schedule::kScheduleKinds) as the pipeline tests sweep it: a
// layout of each kind that the tests' small GPTs hold, so that a sweep meets every kind, one
// added later too, and filters by the kind's traits, never by naming kinds. Plain data, no
// LibTorch.
#pragma once

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/schedule/schedule.h"

namespace pipetrain::job::pipeline_test {

// One kind's layout: `stages` ranks a pipeline, each holding `virtual_stages` model stages.
struct ScheduleCase {
  schedule::ScheduleKind kind;
  int stages;
  int virtual_stages;  // 0: the kind's default
};

// Every kind: `stages` ranks for the kinds whose ranks hold one stage by default (those
// without chunks, and zb1p's ZB-H1); 2 ranks of the kind's default chunks for the others (a
// GPT of 2 or 3 blocks, 5 or 6 layers, holds 2 x 2 chunks).
inline std::vector<ScheduleCase> EveryScheduleKind(int stages) {
  std::vector<ScheduleCase> cases;
  for (const schedule::ScheduleKind kind : schedule::kScheduleKinds) {
    const int v = schedule::DefaultVirtualStages(kind);
    cases.push_back(v > 1 ? ScheduleCase{kind, 2, v} : ScheduleCase{kind, stages, 0});
  }
  return cases;
}

// Whether `kind` runs p ranks of v chunks (0: its default) at m micro-batches a step.
inline bool TakesLayout(schedule::ScheduleKind kind, int p, int v, int m) {
  schedule::ScheduleParams params;
  params.kind = kind;
  params.stages = p;
  params.micro_batches = m;
  params.virtual_stages =
      schedule::HoldsChunks(kind) ? (v > 0 ? v : schedule::DefaultVirtualStages(kind)) : 1;
  return schedule::ValidateScheduleParams(params).ok();
}

// A parameterized test's name for its case: the kind's name ("1f1b", "zbv", ...).
inline std::string CaseName(const ::testing::TestParamInfo<ScheduleCase>& info) {
  return std::string(schedule::ScheduleKindName(info.param.kind));
}

}  // namespace pipetrain::job::pipeline_test
