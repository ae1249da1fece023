// The progress line (runtime/base/progress_line.h): the bar on a terminal, plain lines
// otherwise, rate and duration text.
#include "runtime/base/progress_line.h"

#include <gtest/gtest.h>

namespace pipetrain::progress {
namespace {

Progress At(int64_t done, int64_t steps, double elapsed_s = NAN) {
  Progress p;
  p.state = "running";
  p.done = done;
  p.steps = steps;
  p.loss = 1.23456;
  p.rate = 30774;
  p.unit = "tok";
  p.elapsed_s = elapsed_s;
  return p;
}

TEST(ProgressLine, RateAndDuration) {
  EXPECT_EQ(FormatRate(950), "950");
  EXPECT_EQ(FormatRate(30774), "30.8k");
  EXPECT_EQ(FormatRate(2.5e6), "2.50M");
  EXPECT_EQ(FormatDuration(7), "0:07");
  EXPECT_EQ(FormatDuration(3723), "1:02:03");
  EXPECT_EQ(FormatDuration(NAN), "--:--");
  EXPECT_EQ(FormatDuration(-1), "--:--");
}

TEST(ProgressLine, PlainLinesAboutTwentyTimesARun) {
  ProgressLine line(/*terminal=*/false);
  EXPECT_EQ(line.Update(At(0, 100)),
            "running step 0/100 loss 1.2346 30.8k tok/s elapsed --:-- eta --:--\n");
  int lines = 1;
  for (int64_t done = 1; done <= 100; ++done) lines += !line.Update(At(done, 100, done)).empty();
  EXPECT_EQ(lines, 2 + 20);  // steps 0 and 1, then every 5th
  ProgressLine again(false);
  EXPECT_EQ(again.Update(At(10, 100, 5)),
            "running step 10/100 loss 1.2346 30.8k tok/s elapsed 0:05 eta 0:45\n");
  EXPECT_EQ(again.Update(At(10, 100, 5)), "");  // the same step again: nothing
  Progress no_state = At(100, 100, 50);
  no_state.state.clear();
  EXPECT_EQ(again.Update(no_state), "step 100/100 loss 1.2346 30.8k tok/s elapsed 0:50 eta 0:00\n");
  EXPECT_EQ(again.Finish(), "");
}

TEST(ProgressLine, BarOnATerminalEndsItsLineAtTheLastStep) {
  ProgressLine line(/*terminal=*/true);
  EXPECT_EQ(
      line.Update(At(6, 24, 3)),
      "\r[######..................] running step 6/24  loss 1.2346  30.8k tok/s  ETA 0:09   ");
  EXPECT_EQ(line.Update(At(24, 24, 12)),
            "\r[########################] running step 24/24  loss 1.2346  30.8k tok/s  ETA 0:00   "
            "\n");
  EXPECT_EQ(line.Finish(), "");
  ProgressLine cut(true);
  EXPECT_FALSE(cut.Update(At(3, 24)).empty());
  EXPECT_EQ(cut.Finish(), "\n");  // ended early: the bar's line is ended
  EXPECT_EQ(cut.Finish(), "");
}

}  // namespace
}  // namespace pipetrain::progress
