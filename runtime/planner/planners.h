// Choosing a layout for a job: three planners, each a pure function of a model profile and a
// cluster description, each scoring every layout it considers with the simulation of
// predict.h (step time and per-stage peak memory) and keeping only layouts that fit a
// worker's memory.
//
// All three search depth p and width w with p x w <= workers, and every micro-batch size b
// that divides the global batch B per replica (m = B / (w b) micro-batches per step):
//
//   2bw       PipeDream-2BW (Narayanan et al., ICML 2021, section 4): the 2BW schedule
//             (m >= p), stages split by compute, without and with recomputation of every
//             layer; the highest throughput wins.
//   pipedream PipeDream (SOSP 2019, section 3.1): 1F1B with flush, no recomputation, stages
//             split by PipeDream's dynamic program for w replicas per stage (pipedream.h,
//             slowest stage with activation transfer and AllReduce); the highest throughput
//             wins.
//   hippie    Hippie (Ye et al., ICPP 2021): the last-stage schedule (1F1B with flush, the
//             last stage holding one micro-batch) with the AllReduce overlapped, stages split
//             by compute, and recomputation chosen greedily: layers ordered by the activation
//             bytes recomputing them saves per second of recompute (stash_bytes / forward_s,
//             largest first), and every prefix of that order considered (at most 32, evenly
//             spaced, for a long order). The highest memory
//             efficiency ME = (throughput / throughput_DP) / (memory / memory_DP) wins, where
//             memory is the largest stage's peak and DP is plain data parallelism on the same
//             workers (p = 1, w the most replicas that divide B, no recomputation), predicted
//             the same way whether or not it fits.
//
// A layout fits when every stage's predicted peak is at most PlannableBytes(memory): 90% of
// a worker's memory, the rest left for what the profile does not see (the allocator's slack;
// runs measured up to 2.9% above the prediction over 23 layouts).
//
// On a cluster of several hosts (ClusterProfile::host_workers) every layout is scored on its
// fastest placement on them (host_placement.h), which the chosen layout keeps (rank_hosts).
//
// Ties go to the smaller peak memory. The best layout of each (p, w) with replicas then gets
// its gradient AllReduce chosen too (before the shapes are ranked): stage 0 overlapping it
// with its last backward in buckets of 1, 4, 16 or 64 MiB, or averaging after the backward,
// whichever is predicted fastest. The result names the chosen layout and, for every other
// (p, w) shape considered, its best layout and why it lost.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/planner/predict.h"
#include "runtime/planner/profile.h"

namespace pipetrain::planner {

enum class PlannerKind { kTwoBW, kPipeDream, kHippie };

// "2bw", "pipedream", "hippie".
std::string_view PlannerKindName(PlannerKind kind);
// The names above, case-insensitive; the error lists them.
absl::StatusOr<PlannerKind> ParsePlannerKind(std::string_view name);

// The share of a worker's memory plans may fill, and what that leaves of `memory_bytes`
// (0: not limited).
inline constexpr double kPlannableMemoryShare = 0.9;
int64_t PlannableBytes(int64_t memory_bytes);

struct PlanRequest {
  PlannerKind planner = PlannerKind::kTwoBW;
  int global_batch = 1;                // B: samples per step over all replicas
  std::vector<int> micro_batch_sizes;  // b to consider (empty: every divisor of B)
  bool overlap_allreduce = true;       // stage 0's bucketed AllReduce (Hippie always overlaps)
  // Layouts with more micro-batches per step are not considered: each simulation's work grows
  // with m, and past this many the bubble is already small.
  int max_micro_batches = 128;
  int64_t bucket_bytes = 4 << 20;
  // The most CPU time the calling thread may spend planning, and the latest time it may end:
  // past either, MakePlan stops before its next simulation (DeadlineExceeded, saying how
  // many layouts it simulated).
  absl::Duration cpu_budget = absl::InfiniteDuration();
  absl::Time deadline = absl::InfiniteFuture();
};

struct Candidate {
  Layout layout;
  Prediction prediction;
  double memory_efficiency = 0;  // against the data-parallel reference
  bool fits = true;
  std::string why;  // the chosen one: ""; the others: why they lost
};

struct PlanResult {
  PlannerKind planner = PlannerKind::kTwoBW;
  Candidate chosen;
  std::vector<Candidate> alternatives;  // best first: the best layout of each other shape
  Candidate data_parallel;              // the ME reference (may not fit)
  int considered = 0;                   // layouts simulated
};

// InvalidArgument for a bad request (no layers, B < 1, no workers); ResourceExhausted when no
// layout fits: "does not fit: needs X bytes on stage s, have Y" for the layout that came
// closest.
absl::StatusOr<PlanResult> MakePlan(const ModelProfile& profile, const ClusterProfile& cluster,
                                    const PlanRequest& request);

// Hippie's greedy order at micro-batch size b: the layers that hold activations for their
// backward (stash_bytes > 0), by stash_bytes / forward_s, largest first (ties: lower index).
std::vector<int> HippieRecomputeOrder(const std::vector<LayerProfile>& layers);

}  // namespace pipetrain::planner
