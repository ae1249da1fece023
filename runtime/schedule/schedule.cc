#include "runtime/schedule/schedule.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "runtime/base/errors.h"
#include "runtime/base/status_macros.h"

namespace pipetrain::schedule {
namespace {

struct KindAlias {
  absl::string_view name;  // Debian's Abseil: absl::string_view is not std::string_view
  ScheduleKind kind;
};

constexpr KindAlias kKindAliases[] = {
    {"gpipe", ScheduleKind::kGPipe},
    {"1f1b", ScheduleKind::kOneFOneB},
    {"2bw", ScheduleKind::kTwoBW},
    {"flush", ScheduleKind::kOneFOneB},
    {"pipedream-flush", ScheduleKind::kOneFOneB},
    {"pipedream-2bw", ScheduleKind::kTwoBW},
    {"last-stage", ScheduleKind::kOneFOneB},  // Hippie's name for the same schedule
};

bool IsKnownKind(ScheduleKind kind) {
  return kind == ScheduleKind::kGPipe || kind == ScheduleKind::kOneFOneB ||
         kind == ScheduleKind::kTwoBW;
}

// Appends F<j> with the communication placed around it (see schedule.h).
void AppendForward(int p, int s, int64_t j, std::vector<Action>* out) {
  if (s > 0) out->push_back(RecvAct(j));
  out->push_back(F(j));
  if (s < p - 1) out->push_back(SendAct(j));
}

// Appends B<j> with its communication, then STEP<t> if j is the last micro-batch of
// mini-batch t. STEP comes after SEND_GRAD<j>, so that the upstream stage is not held up by
// the weight update.
void AppendBackward(int p, int s, int m, int64_t j, std::vector<Action>* out) {
  if (s < p - 1) out->push_back(RecvGrad(j));
  out->push_back(B(j));
  if (s > 0) out->push_back(SendGrad(j));
  if ((j + 1) % m == 0) out->push_back(Step(j / m));
}

// 1F1B over micro-batches first .. first+count-1: warm-up forwards, (F, B) pairs, then the
// remaining backwards.
void AppendOneFOneB(int p, int s, int m, int64_t first, int64_t count, std::vector<Action>* out) {
  const int64_t warmup = std::min<int64_t>(p - s - 1, count);
  for (int64_t i = 0; i < warmup; ++i) AppendForward(p, s, first + i, out);
  for (int64_t i = 0; i < count - warmup; ++i) {
    AppendForward(p, s, first + warmup + i, out);
    AppendBackward(p, s, m, first + i, out);
  }
  for (int64_t i = count - warmup; i < count; ++i) AppendBackward(p, s, m, first + i, out);
}

}  // namespace

std::string_view ScheduleKindName(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return "gpipe";
    case ScheduleKind::kOneFOneB:
      return "1f1b";
    case ScheduleKind::kTwoBW:
      return "2bw";
  }
  return "unknown";
}

absl::StatusOr<ScheduleKind> ParseScheduleKind(std::string_view name) {
  const std::string original(name);
  std::string lower = original;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  std::vector<absl::string_view> accepted;
  for (const KindAlias& alias : kKindAliases) {
    if (alias.name == lower) return alias.kind;
    accepted.push_back(alias.name);
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown schedule kind '", original,
                                                 "'; accepted: ", absl::StrJoin(accepted, ", ")));
}

absl::Status ValidateScheduleParams(const ScheduleParams& params) {
  std::vector<std::string> errors;
  if (!IsKnownKind(params.kind)) {
    errors.push_back(absl::StrCat("unknown schedule kind ", static_cast<int>(params.kind)));
  }
  if (params.stages < 1) {
    errors.push_back(absl::StrCat("stages must be >= 1: got p=", params.stages));
  }
  if (params.micro_batches < 1) {
    errors.push_back(absl::StrCat("micro_batches must be >= 1: got m=", params.micro_batches));
  }
  if (params.steps < 1) {
    errors.push_back(absl::StrCat("steps must be >= 1: got steps=", params.steps));
  }
  for (int64_t n : params.flush_before) {
    if (n <= 0 || n >= params.steps) {
      errors.push_back(absl::StrCat("flush_before ", n, " is not a boundary: 0 < N < steps=",
                                    params.steps));
    }
  }
  if (params.kind == ScheduleKind::kTwoBW && params.micro_batches < params.stages) {
    errors.push_back(absl::StrCat("2bw needs micro_batches >= stages: got m=", params.micro_batches,
                                  " < p=", params.stages));
  }
  if (errors.empty()) return absl::OkStatus();
  return InvalidArgumentList("", errors);
}

absl::StatusOr<std::vector<Action>> BuildStageSchedule(const ScheduleParams& params, int stage) {
  PT_RETURN_IF_ERROR(ValidateScheduleParams(params));
  const int p = params.stages;
  const int m = params.micro_batches;
  if (stage < 0 || stage >= p) {
    return absl::InvalidArgumentError(absl::StrCat("stage ", stage, " out of range [0, ", p, ")"));
  }
  std::vector<Action> out;
  // Each micro-batch costs at most 6 actions (RECV, F, SEND twice), plus one STEP per step.
  out.reserve(static_cast<size_t>(params.steps) * (6 * static_cast<size_t>(m) + 1));
  switch (params.kind) {
    case ScheduleKind::kGPipe:
      for (int64_t t = 0; t < params.steps; ++t) {
        const int64_t first = t * m;
        for (int64_t i = 0; i < m; ++i) AppendForward(p, stage, first + i, &out);
        for (int64_t i = 0; i < m; ++i) AppendBackward(p, stage, m, first + i, &out);
      }
      break;
    case ScheduleKind::kOneFOneB:
      for (int64_t t = 0; t < params.steps; ++t) {
        AppendOneFOneB(p, stage, m, t * m, m, &out);
      }
      break;
    case ScheduleKind::kTwoBW: {
      std::vector<int64_t> cuts = params.flush_before;
      cuts.push_back(params.steps);
      std::sort(cuts.begin(), cuts.end());
      cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
      int64_t begin = 0;
      for (int64_t end : cuts) {
        AppendOneFOneB(p, stage, m, begin * m, (end - begin) * m, &out);
        begin = end;
      }
      break;
    }
  }
  return out;
}

absl::StatusOr<std::vector<std::vector<Action>>> BuildSchedule(const ScheduleParams& params) {
  PT_RETURN_IF_ERROR(ValidateScheduleParams(params));
  std::vector<std::vector<Action>> stages;
  stages.reserve(params.stages);
  for (int s = 0; s < params.stages; ++s) {
    PT_ASSIGN_OR_RETURN(std::vector<Action> actions, BuildStageSchedule(params, s));
    stages.push_back(std::move(actions));
  }
  return stages;
}

}  // namespace pipetrain::schedule
