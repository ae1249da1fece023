// schedule_build_bench: what building and checking one layout's schedule costs the planners.
// Predict (runtime/planner) calls schedule::BuildSchedule once for every layout it scores,
// for the 8 steps it simulates; for a kind that flushes that is the one-step compute lists,
// their messages (communication.h) checked deadlock-free, and the steps repeated. Per shape,
// the median over rounds of the mean time of a call (each round about 50 ms of calls).
//
// Run:  build/bench/schedule_build_bench [--rounds 9]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/schedule/schedule.h"

namespace pipetrain::bench {
namespace {

using schedule::ScheduleKind;

struct Shape {
  ScheduleKind kind;
  int p, m, v;
};

// Seconds per BuildSchedule call of `params`, over calls adding up to about 50 ms.
double SecondsPerCall(const schedule::ScheduleParams& params) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  int calls = 0;
  size_t actions = 0;  // read, so that the calls are not optimised away
  while (Clock::now() - start < std::chrono::milliseconds(50)) {
    absl::StatusOr<std::vector<std::vector<schedule::Action>>> lists =
        schedule::BuildSchedule(params);
    if (!lists.ok()) {
      std::fprintf(stderr, "%s\n", std::string(lists.status().message()).c_str());
      std::exit(1);
    }
    for (const auto& list : *lists) actions += list.size();
    ++calls;
  }
  if (actions == 0) std::exit(1);
  return std::chrono::duration<double>(Clock::now() - start).count() / calls;
}

int Main(int argc, char** argv) {
  int rounds = 9;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
      rounds = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--rounds N]\n", argv[0]);
      return 2;
    }
  }
  const std::vector<Shape> shapes = {
      {ScheduleKind::kOneFOneB, 4, 8, 1},      {ScheduleKind::kZeroBubbleV, 4, 8, 2},
      {ScheduleKind::kOneFOneB, 16, 64, 1},    {ScheduleKind::kGPipe, 16, 64, 1},
      {ScheduleKind::kTwoBW, 16, 64, 1},       {ScheduleKind::kInterleaved, 16, 64, 2},
      {ScheduleKind::kZeroBubbleV, 16, 64, 2}, {ScheduleKind::kDualPipeV, 16, 64, 2},
  };
  // Rounds interleave the shapes, so that a swing of the machine's speed falls on all.
  std::vector<std::vector<double>> seconds(shapes.size());
  for (int round = 0; round < rounds; ++round) {
    for (size_t k = 0; k < shapes.size(); ++k) {
      schedule::ScheduleParams params{shapes[k].kind, shapes[k].p, shapes[k].m, /*steps=*/8};
      params.virtual_stages = shapes[k].v;
      seconds[k].push_back(SecondsPerCall(params));
    }
  }
  std::printf("BuildSchedule for 8 steps (as Predict calls it), median of %d rounds\n\n", rounds);
  std::printf("| schedule | p | m | v | per call |\n|---|---|---|---|---|\n");
  for (size_t k = 0; k < shapes.size(); ++k) {
    std::vector<double>& s = seconds[k];
    std::sort(s.begin(), s.end());
    std::printf("| %s | %d | %d | %d | %.1f us |\n",
                std::string(schedule::ScheduleKindName(shapes[k].kind)).c_str(), shapes[k].p,
                shapes[k].m, shapes[k].v, 1e6 * s[s.size() / 2]);
  }
  return 0;
}

}  // namespace
}  // namespace pipetrain::bench

int main(int argc, char** argv) { return pipetrain::bench::Main(argc, argv); }
