#include "runtime/schedule/action.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::schedule {
namespace {

using ::testing::HasSubstr;

TEST(ActionTest, ToStringOfEveryKind) {
  EXPECT_EQ(ToString(F(3)), "F3");
  EXPECT_EQ(ToString(B(3)), "B3");
  EXPECT_EQ(ToString(SendAct(3)), "SEND_ACT3");
  EXPECT_EQ(ToString(RecvAct(3)), "RECV_ACT3");
  EXPECT_EQ(ToString(SendGrad(3)), "SEND_GRAD3");
  EXPECT_EQ(ToString(RecvGrad(3)), "RECV_GRAD3");
  EXPECT_EQ(ToString(Step(0)), "STEP0");
  EXPECT_EQ(ToString(F(1234567890123)), "F1234567890123");
}

TEST(ActionTest, RoundTripEveryKind) {
  const std::vector<Action> all = {F(0),        B(1),    SendAct(2), RecvAct(3), SendGrad(4),
                                   RecvGrad(5), Step(6), F(10),      B(99),      Step(123456)};
  for (const Action& a : all) {
    absl::StatusOr<Action> parsed = ParseAction(ToString(a));
    ASSERT_TRUE(parsed.ok()) << ToString(a) << ": " << parsed.status();
    EXPECT_EQ(*parsed, a) << ToString(a);
  }
  const std::string text = FormatActions(all);
  EXPECT_EQ(text, "F0 B1 SEND_ACT2 RECV_ACT3 SEND_GRAD4 RECV_GRAD5 STEP6 F10 B99 STEP123456");
  absl::StatusOr<std::vector<Action>> list = ParseActions(text);
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(*list, all);
}

TEST(ActionTest, ParseErrors) {
  for (const char* bad : {"X3", "F", "F-1", "F3x", "", "f3", "SEND3", "SEND_ACT", " F3", "F3 ",
                          "F+3", "F03", "STEP_0", "F99999999999999999999"}) {
    absl::StatusOr<Action> parsed = ParseAction(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << "'" << bad << "'";
  }
  EXPECT_THAT(ParseAction("X3").status().message(), HasSubstr("unknown action name 'X'"));
  EXPECT_THAT(ParseAction("F").status().message(), HasSubstr("missing number"));
  EXPECT_THAT(ParseAction("F-1").status().message(), HasSubstr("negative"));
  EXPECT_THAT(ParseAction("F3x").status().message(), HasSubstr("trailing text 'x'"));
  EXPECT_THAT(ParseAction("F3x").status().message(), HasSubstr("'F3x'"));
}

TEST(ActionTest, ParseActionsWhitespaceAndEmpty) {
  absl::StatusOr<std::vector<Action>> empty = ParseActions("");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
  absl::StatusOr<std::vector<Action>> blank = ParseActions(" \t\n ");
  ASSERT_TRUE(blank.ok());
  EXPECT_TRUE(blank->empty());
  absl::StatusOr<std::vector<Action>> list = ParseActions("  F0\tSEND_ACT0\n\nB0  STEP0 ");
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(*list, (std::vector<Action>{F(0), SendAct(0), B(0), Step(0)}));
  EXPECT_EQ(FormatActions({}), "");
}

TEST(ActionTest, ParseActionsNamesTheBadToken) {
  absl::StatusOr<std::vector<Action>> list = ParseActions("F0 F1 Q2 B0");
  EXPECT_EQ(list.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(list.status().message(), HasSubstr("action 2"));
  EXPECT_THAT(list.status().message(), HasSubstr("'Q2'"));
}

}  // namespace
}  // namespace pipetrain::schedule
