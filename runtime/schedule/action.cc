#include "runtime/schedule/action.h"

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace pipetrain::schedule {
namespace {

// Debian's Abseil has its own string_view (not std::string_view): the text helpers work in
// absl::string_view and convert at the API boundary.
struct KindName {
  ActionKind kind;
  absl::string_view name;
};

constexpr KindName kKindNames[] = {
    {ActionKind::kForward, "F"},
    {ActionKind::kBackward, "B"},
    {ActionKind::kInputGradient, "I"},
    {ActionKind::kWeightGradient, "W"},
    {ActionKind::kSendActivation, "SEND_ACT"},
    {ActionKind::kRecvActivation, "RECV_ACT"},
    {ActionKind::kSendGradient, "SEND_GRAD"},
    {ActionKind::kRecvGradient, "RECV_GRAD"},
    {ActionKind::kOptimizerStep, "STEP"},
};

// At most 18 decimal digits always fit in int64_t.
constexpr size_t kMaxDigits = 18;

absl::string_view NameOf(ActionKind kind) {
  for (const KindName& kn : kKindNames) {
    if (kn.kind == kind) return kn.name;
  }
  return "UNKNOWN";
}

bool IsNameChar(char c) { return (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

}  // namespace

std::string ToString(const Action& action) {
  if (action.stage == kOwnStage) return absl::StrCat(NameOf(action.kind), action.index);
  return absl::StrCat(action.stage, NameOf(action.kind), action.index);
}

absl::StatusOr<Action> ParseAction(std::string_view std_text) {
  const absl::string_view text(std_text.data(), std_text.size());
  auto error = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("bad action '", text, "': ", why));
  };
  // An optional stage number before the name.
  size_t stage_digits = 0;
  while (stage_digits < text.size() && IsDigit(text[stage_digits])) ++stage_digits;
  if (stage_digits > 1 && text[0] == '0') return error("leading zero in stage");
  if (stage_digits > 9) return error("stage too large");
  int stage = kOwnStage;
  if (stage_digits > 0) {
    stage = 0;
    for (size_t i = 0; i < stage_digits; ++i) stage = stage * 10 + (text[i] - '0');
  }
  size_t pos = stage_digits;
  while (pos < text.size() && IsNameChar(text[pos])) ++pos;
  const absl::string_view name = text.substr(stage_digits, pos - stage_digits);
  const KindName* found = nullptr;
  for (const KindName& kn : kKindNames) {
    if (kn.name == name) found = &kn;
  }
  if (found == nullptr) {
    std::vector<absl::string_view> names;
    for (const KindName& kn : kKindNames) names.push_back(kn.name);
    return error(absl::StrCat("unknown action name '", name, "' (expected one of ",
                              absl::StrJoin(names, ", "),
                              " followed by a number, optionally after a stage number)"));
  }
  const absl::string_view rest = text.substr(pos);
  if (rest.empty()) return error("missing number");
  if (rest[0] == '-') return error("negative number");
  size_t digits = 0;
  while (digits < rest.size() && IsDigit(rest[digits])) ++digits;
  if (digits == 0) return error("missing number");
  if (digits < rest.size()) {
    return error(absl::StrCat("trailing text '", rest.substr(digits), "'"));
  }
  if (digits > 1 && rest[0] == '0') return error("leading zero in number");
  if (digits > kMaxDigits) return error("number too large");
  int64_t index = 0;
  for (char c : rest) index = index * 10 + (c - '0');
  return Action{found->kind, index, stage};
}

std::string FormatActions(const std::vector<Action>& actions) {
  return absl::StrJoin(
      actions, " ", [](std::string* out, const Action& a) { absl::StrAppend(out, ToString(a)); });
}

absl::StatusOr<std::vector<Action>> ParseActions(std::string_view std_text) {
  const absl::string_view text(std_text.data(), std_text.size());
  std::vector<Action> actions;
  const std::vector<absl::string_view> tokens =
      absl::StrSplit(text, absl::ByAnyChar(" \t\r\n"), absl::SkipEmpty());
  actions.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    absl::StatusOr<Action> action =
        ParseAction(std::string_view(tokens[i].data(), tokens[i].size()));
    if (!action.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("action ", i, " of list: ", action.status().message()));
    }
    actions.push_back(*action);
  }
  return actions;
}

}  // namespace pipetrain::schedule
