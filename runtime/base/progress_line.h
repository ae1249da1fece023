// The progress line of a training job on stderr, one format for pipetrain-run and for the
// CLI following a job on a coordinator (`submit --follow`, `run` on a local cluster).
//
// On a terminal, a bar redrawn in place, its line ended at the last step:
//   [############............] running step 150/300  loss 1.8123  30.8k tok/s  ETA 0:10
// Otherwise a plain line for the first steps, every steps/20 and the last (about 20 a run):
//   running step 150/300 loss 1.8123 30.8k tok/s elapsed 0:10 eta 0:10
// The state ("running") is left out when not given; the ETA is "--:--" until two steps are
// done (the first includes the start) or when the elapsed time is not known.
//
// Header-only and Abseil only (no gRPC, no LibTorch): pipetrain-run, which builds without
// gRPC, and the CLI, which links no runtime, share it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pipetrain::progress {

// 7 -> "0:07", 3723 -> "1:02:03"; "--:--" when unknown (NaN, infinite or negative).
inline std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  return s >= 3600 ? absl::StrFormat("%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60)
                   : absl::StrFormat("%d:%02d", s / 60, s % 60);
}

// 950 -> "950", 30774 -> "30.8k", 2.5e6 -> "2.50M".
inline std::string FormatRate(double per_s) {
  if (per_s >= 1e6) return absl::StrFormat("%.2fM", per_s / 1e6);
  if (per_s >= 1e3) return absl::StrFormat("%.1fk", per_s / 1e3);
  return absl::StrFormat("%.0f", per_s);
}

// Where a job is.
struct Progress {
  std::string state;       // e.g. "running"; empty: not shown
  int64_t done = 0;        // steps finished
  int64_t steps = 0;       // in the job
  double loss = 0;         // of the last step finished
  double rate = 0;         // data units a second
  std::string unit;        // the data unit: "tok" or "samples"
  double elapsed_s = NAN;  // since the job started; NaN: not known
};

// One job's line. Not thread-safe.
class ProgressLine {
 public:
  explicit ProgressLine(bool terminal) : terminal_(terminal) {}

  // What to write for `p`: on a terminal the redrawn bar; otherwise a line when one is due.
  // "" when nothing is (or `p.done` is the one written last).
  std::string Update(const Progress& p) {
    if (p.done == last_done_) return "";
    last_done_ = p.done;
    const std::string state = p.state.empty() ? "" : p.state + " ";
    const double eta =
        p.done >= 2 ? p.elapsed_s / static_cast<double>(p.done) * (p.steps - p.done) : NAN;
    const std::string rate = absl::StrCat(FormatRate(p.rate), " ", p.unit, "/s");
    if (terminal_) {
      constexpr int64_t kWidth = 24;
      const int64_t filled =
          std::clamp<int64_t>(kWidth * p.done / std::max<int64_t>(1, p.steps), 0, kWidth);
      open_ = p.done < p.steps;
      return absl::StrFormat("\r[%s%s] %sstep %d/%d  loss %.4f  %s  ETA %s   %s",
                             std::string(filled, '#'), std::string(kWidth - filled, '.'), state,
                             p.done, p.steps, p.loss, rate, FormatDuration(eta), open_ ? "" : "\n");
    }
    const int64_t every = std::max<int64_t>(1, p.steps / 20);
    if (p.done > 1 && p.done % every != 0 && p.done != p.steps) return "";
    return absl::StrFormat("%sstep %d/%d loss %.4f %s elapsed %s eta %s\n", state, p.done, p.steps,
                           p.loss, rate, FormatDuration(p.elapsed_s), FormatDuration(eta));
  }

  // "\n" if a bar is left on its line (the job ended before its last step), else "".
  std::string Finish() {
    const bool open = open_;
    open_ = false;
    return open ? "\n" : "";
  }

 private:
  bool terminal_;
  bool open_ = false;       // a bar is on the line, not ended
  int64_t last_done_ = -1;  // the step count written last
};

}  // namespace pipetrain::progress
