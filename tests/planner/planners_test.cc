// The three planners: the 2BW planner recomputes when a memory cap forbids the plan it would
// choose without; Hippie's recompute set is a prefix of its greedy order and the cap moves it
// along that order; no chosen layout of any planner exceeds the memory it was given, on 200
// random profiles, with its memory checked against a count made here from the profile and the
// schedule's in-flight table; the gradient AllReduce (overlap, bucket size) is chosen for the
// cores there are; a model that fits nowhere is a clear error.
#include "runtime/planner/planners.h"

#include <algorithm>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/schedule/simulator.h"

namespace pipetrain::planner {
namespace {

using schedule::ScheduleKind;
using ::testing::HasSubstr;

// 8 equal layers of 1 MB of weights (AdamW state 2 MB) that stash 8 MB each per micro-batch
// of 4 samples and hand on 1 MB.
ModelProfile Layers() {
  ModelProfile profile;
  MicroBatchProfile size;
  size.micro_batch_size = 4;
  size.layers.resize(8);
  for (LayerProfile& l : size.layers) {
    l.forward_s = 0.010;
    l.backward_s = 0.020;
    l.optimizer_s = 0.001;
    l.parameter_bytes = 1 << 20;
    l.optimizer_bytes = 2 << 20;
    l.stash_bytes = 8 << 20;
    l.output_bytes = 1 << 20;
  }
  profile.sizes.push_back(size);
  return profile;
}

ClusterProfile Cluster(int workers, int64_t memory) {
  ClusterProfile cluster;
  cluster.workers = workers;
  cluster.link = {1e-5, 1e9};
  cluster.memory_bytes = memory;
  return cluster;
}

// The memory of stage s of `layout`, counted from the profile and the schedule's own action
// list, independently of the simulation: a ledger of what is allocated and freed as the stage
// runs its actions (three steps), and its highest point.
int64_t CountedMemory(const ModelProfile& profile, const Layout& layout, int s) {
  const std::vector<LayerProfile> layers = LayersAt(profile, layout.pipeline.micro_batch_size);
  const auto [begin, end] = layout.pipeline.stage_layers[s];
  const int versions = layout.schedule == ScheduleKind::kTwoBW ? 2 : 1;
  int64_t weights = 0;
  for (int l = begin; l < end; ++l) {
    weights += versions * layers[l].parameter_bytes + layers[l].optimizer_bytes;
  }
  const int64_t input = begin > 0 ? layers[begin - 1].output_bytes : 0;
  // What layer l keeps from a forward to its backward: its stash and output, or inside a
  // recomputed run nothing but the run's output.
  auto kept = [&](int l) -> int64_t {
    if (!layout.recomputes(l)) return layers[l].stash_bytes + layers[l].output_bytes;
    return l + 1 == end || !layout.recomputes(l + 1) ? layers[l].output_bytes : 0;
  };
  schedule::ScheduleParams params{layout.schedule, layout.stages(), layout.pipeline.micro_batches,
                                  3};
  absl::StatusOr<std::vector<schedule::Action>> list = schedule::BuildStageSchedule(params, s);
  EXPECT_TRUE(list.ok());
  // With replicas the gradient is averaged on a flat copy of it: stage 0 with the AllReduce
  // overlapped copies each piece's gradient as the step's last backward finishes it, the
  // others copy all of it at the update.
  const bool copies = layout.pipeline.replicas > 1;
  const bool overlapped = copies && s == 0 && layout.overlap_allreduce;
  std::vector<bool> last_of_step(list->size(), false);
  for (size_t i = 0, last = list->size(); i < list->size(); ++i) {
    if ((*list)[i].kind == schedule::ActionKind::kBackward) last = i;
    if ((*list)[i].kind == schedule::ActionKind::kOptimizerStep && last < list->size()) {
      last_of_step[last] = true;
      last = list->size();
    }
  }
  int64_t gradient = 0;
  for (int l = begin; l < end; ++l) gradient += layers[l].parameter_bytes;
  int64_t live = 0, highest = 0, in_flight = 0;
  bool has_gradient = false;
  for (size_t i = 0; i < list->size(); ++i) {
    const schedule::Action& a = (*list)[i];
    const bool copying = overlapped && last_of_step[i];
    int64_t copied = 0;
    switch (a.kind) {
      case schedule::ActionKind::kForward:
        ++in_flight;
        live += input;
        for (int l = begin; l < end; ++l) live += kept(l);
        highest = std::max(highest, live);
        break;
      case schedule::ActionKind::kBackward:
        // Layer by layer from the last; a recomputed run is one piece, whose backward
        // recomputes everything its layers stash. The first backward of a step allocates
        // the gradient of each piece's parameters.
        for (int l = end - 1; l >= begin;) {
          std::vector<int> piece = {l};
          while (layout.recomputes(l) && piece.back() > begin &&
                 layout.recomputes(piece.back() - 1)) {
            piece.push_back(piece.back() - 1);
          }
          int64_t transient = 0, working = 0;
          for (int k : piece) {
            if (!has_gradient) live += layers[k].parameter_bytes;
            if (layout.recomputes(k)) transient += layers[k].stash_bytes + layers[k].output_bytes;
            working = std::max(working, layers[k].working_bytes);
          }
          highest = std::max(highest, live + transient + working);
          for (int k : piece) {
            live -= kept(k);
            if (copying) {
              live += layers[k].parameter_bytes;
              copied += layers[k].parameter_bytes;
            }
          }
          l = piece.back() - 1;
        }
        live -= input;
        highest = std::max(highest, live);
        live -= copied;  // averaged into the gradient before the backward ends
        --in_flight;
        has_gradient = true;
        break;
      case schedule::ActionKind::kOptimizerStep:
        if (copies && !overlapped && has_gradient) highest = std::max(highest, live + gradient);
        if (has_gradient) live -= gradient;
        has_gradient = false;
        break;
      default: break;
    }
  }
  EXPECT_EQ(live, 0);
  EXPECT_EQ(in_flight, 0);
  return weights + highest;
}

void ExpectConsistent(const ModelProfile& profile, const ClusterProfile& cluster,
                      const PlanRequest& request, const PlanResult& plan) {
  const Layout& l = plan.chosen.layout;
  EXPECT_LE(l.stages() * l.pipeline.replicas, cluster.workers);
  EXPECT_EQ(l.global_batch(), request.global_batch);
  ASSERT_EQ(static_cast<int>(plan.chosen.prediction.stages.size()), l.stages());
  for (int s = 0; s < l.stages(); ++s) {
    const int64_t bytes = plan.chosen.prediction.stages[s].peak_memory_bytes;
    EXPECT_EQ(bytes, CountedMemory(profile, l, s)) << "stage " << s;
    if (cluster.memory_bytes > 0) {
      // Within the share of the memory plans may fill, so within the memory.
      EXPECT_LE(bytes, PlannableBytes(cluster.memory_bytes)) << "stage " << s;
      EXPECT_LT(PlannableBytes(cluster.memory_bytes), cluster.memory_bytes);
    }
  }
}

TEST(TwoBWPlanner, RecomputesWhenTheMemoryCapForbidsThePlanWithout) {
  const ModelProfile profile = Layers();
  PlanRequest request{PlannerKind::kTwoBW, 32, {1, 2, 4, 8}};
  absl::StatusOr<PlanResult> free = MakePlan(profile, Cluster(4, 0), request);
  ASSERT_TRUE(free.ok()) << free.status();
  EXPECT_EQ(free->chosen.layout.schedule, ScheduleKind::kTwoBW);
  EXPECT_TRUE(free->chosen.layout.recompute.empty());  // recomputing costs: never for nothing
  // Lower the cap until no layout without recomputation fits, then once more.
  int64_t smallest = 0;
  for (int64_t cap = int64_t{1} << 34; cap > (1 << 20); cap -= cap / 64) {
    absl::StatusOr<PlanResult> plan = MakePlan(profile, Cluster(4, cap), request);
    if (!plan.ok() || !plan->chosen.layout.recompute.empty()) break;
    smallest = cap;
  }
  ASSERT_GT(smallest, 0);
  const ClusterProfile capped_cluster = Cluster(4, smallest - smallest / 64 - 1);
  absl::StatusOr<PlanResult> capped = MakePlan(profile, capped_cluster, request);
  ASSERT_TRUE(capped.ok()) << capped.status();
  EXPECT_FALSE(capped->chosen.layout.recompute.empty());
  ExpectConsistent(profile, capped_cluster, request, *capped);
  // The cap forbids the layout chosen without one.
  EXPECT_GT(free->chosen.prediction.peak_memory_bytes, PlannableBytes(capped_cluster.memory_bytes));
}

TEST(HippiePlanner, RecomputesAPrefixOfTheGreedyOrder) {
  // Layers whose stash per second of forward differs: the order is by that ratio.
  ModelProfile profile = Layers();
  std::vector<LayerProfile>& layers = profile.sizes[0].layers;
  const std::vector<int64_t> stash = {8, 1, 6, 3, 7, 2, 5, 4};
  for (int l = 0; l < 8; ++l) layers[l].stash_bytes = stash[l] << 20;
  layers[3].stash_bytes = 0;  // keeps nothing: never worth recomputing
  const std::vector<int> order = HippieRecomputeOrder(layers);
  EXPECT_EQ(order, (std::vector<int>{0, 4, 2, 6, 7, 5, 1}));
  PlanRequest request{PlannerKind::kHippie, 16, {}};
  int recomputed_some = 0;
  for (int64_t cap :
       {int64_t{0}, int64_t{60} << 20, int64_t{45} << 20, int64_t{36} << 20, int64_t{30} << 20}) {
    SCOPED_TRACE("cap " + std::to_string(cap));
    const ClusterProfile cluster = Cluster(4, cap);
    absl::StatusOr<PlanResult> plan = MakePlan(profile, cluster, request);
    if (!plan.ok()) {
      EXPECT_THAT(plan.status().message(), HasSubstr("does not fit: needs "));
      continue;
    }
    ExpectConsistent(profile, cluster, request, *plan);
    const Layout& l = plan->chosen.layout;
    EXPECT_EQ(l.schedule, ScheduleKind::kOneFOneB);
    EXPECT_TRUE(l.overlap_allreduce);
    // The recomputed layers are exactly the first k of the order.
    int k = 0;
    for (int layer = 0; layer < 8; ++layer) k += l.recomputes(layer);
    recomputed_some += k > 0;
    for (int i = 0; i < static_cast<int>(order.size()); ++i) {
      EXPECT_EQ(l.recomputes(order[i]), i < k) << "layer " << order[i];
    }
    EXPECT_FALSE(l.recomputes(3));
    EXPECT_GT(plan->chosen.memory_efficiency, 0);
    for (const Candidate& c : plan->alternatives) {
      if (c.fits) {
        EXPECT_LE(c.memory_efficiency, plan->chosen.memory_efficiency * (1 + 1e-9));
      }
      EXPECT_FALSE(c.why.empty());
    }
  }
  EXPECT_GT(recomputed_some, 0);
}

TEST(Planners, NoPlanExceedsTheMemoryItWasGiven) {
  std::mt19937_64 random(7);
  std::uniform_int_distribution<int> layer_count(1, 8), worker_count(1, 6), batch_pow(0, 4);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  int planned = 0, refused = 0;
  for (int trial = 0; trial < 200; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    ModelProfile profile;
    MicroBatchProfile size;
    size.micro_batch_size = 2;
    size.layers.resize(layer_count(random));
    for (LayerProfile& l : size.layers) {
      l.forward_s = 0.001 + unit(random) * 0.01;
      l.backward_s = 2 * l.forward_s;
      l.optimizer_s = 0.1 * l.forward_s;
      l.parameter_bytes = static_cast<int64_t>(unit(random) * (4 << 20));
      l.optimizer_bytes = 2 * l.parameter_bytes;
      l.stash_bytes = static_cast<int64_t>(unit(random) * (16 << 20));
      l.output_bytes = static_cast<int64_t>(unit(random) * (2 << 20));
      l.working_bytes = static_cast<int64_t>(unit(random) * (1 << 20));
    }
    profile.sizes.push_back(size);
    const ClusterProfile cluster =
        Cluster(worker_count(random), static_cast<int64_t>(unit(random) * (96 << 20)));
    const PlannerKind kind = static_cast<PlannerKind>(trial % 3);
    const PlanRequest request{kind, 2 << batch_pow(random), {}};
    absl::StatusOr<PlanResult> plan = MakePlan(profile, cluster, request);
    if (!plan.ok()) {
      EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted) << plan.status();
      EXPECT_THAT(plan.status().message(), HasSubstr("does not fit: needs "));
      ++refused;
      continue;
    }
    ++planned;
    ExpectConsistent(profile, cluster, request, *plan);
    if (kind == PlannerKind::kTwoBW) {
      EXPECT_GE(plan->chosen.layout.pipeline.micro_batches, plan->chosen.layout.stages());
    }
  }
  EXPECT_GT(planned, 50);
  EXPECT_GT(refused, 10);
}

TEST(Planners, PipeDreamPicksTheFasterOfItsLayouts) {
  const ModelProfile profile = Layers();
  const PlanRequest request{PlannerKind::kPipeDream, 16, {}};
  absl::StatusOr<PlanResult> plan = MakePlan(profile, Cluster(4, 0), request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->chosen.layout.schedule, ScheduleKind::kOneFOneB);
  EXPECT_TRUE(plan->chosen.layout.recompute.empty());
  ASSERT_FALSE(plan->alternatives.empty());
  for (const Candidate& c : plan->alternatives) {
    EXPECT_LE(c.prediction.samples_per_s, plan->chosen.prediction.samples_per_s * (1 + 1e-9));
    EXPECT_THAT(c.why, ::testing::AnyOf(HasSubstr("lower throughput"), HasSubstr("as good")));
  }
  EXPECT_GT(plan->considered, 10);
}

// One layer (f = 1 s, b = 2 s, optimizer 0.5 s) of 1e6 parameter bytes whose AllReduce costs
// each rank 0.25 s of CPU per collective + 1 s per 1e6 bytes; a global batch of 2 on 2 workers.
// Asked for 256 KiB buckets (4 collectives), the planner keeps 2 replicas but, on cores the
// ranks share, averages after the backward (4.75 s a step, not 5.5: overlapped buckets take
// their CPU from the backward); with cores to spare it keeps the overlap (3.5 s).
TEST(Planners, TheGradientAllReduceIsChosenForTheCoresThereAre) {
  ModelProfile profile;
  MicroBatchProfile size;
  size.micro_batch_size = 1;
  size.layers.push_back({"only", 1.0, 2.0, 0.5, 100, 1'000'000, 2'000'000, 10, 1});
  profile.sizes.push_back(size);
  profile.allreduce_cpu = {0.25, 1e6};
  ClusterProfile cluster = Cluster(2, 0);
  cluster.allreduce = {0, 1e30};
  PlanRequest request{PlannerKind::kPipeDream, 2, {}};
  request.bucket_bytes = 256 << 10;
  cluster.shared_cores = 2;
  absl::StatusOr<PlanResult> shared = MakePlan(profile, cluster, request);
  ASSERT_TRUE(shared.ok()) << shared.status();
  EXPECT_EQ(shared->chosen.layout.pipeline.replicas, 2);
  EXPECT_FALSE(shared->chosen.layout.overlap_allreduce);
  EXPECT_NEAR(shared->chosen.prediction.step_time_s, 4.75, 1e-9);
  cluster.shared_cores = 0;
  absl::StatusOr<PlanResult> spare = MakePlan(profile, cluster, request);
  ASSERT_TRUE(spare.ok()) << spare.status();
  EXPECT_EQ(spare->chosen.layout.pipeline.replicas, 2);
  EXPECT_TRUE(spare->chosen.layout.overlap_allreduce);
  EXPECT_NEAR(spare->chosen.prediction.step_time_s, 3.5, 1e-9);
}

TEST(Planners, AModelThatFitsNowhereIsAClearError) {
  const ModelProfile profile = Layers();
  absl::StatusOr<PlanResult> plan =
      MakePlan(profile, Cluster(2, 1 << 20), PlanRequest{PlannerKind::kTwoBW, 8, {}});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(plan.status().message(), HasSubstr("does not fit: needs "));
  EXPECT_THAT(plan.status().message(), HasSubstr(" bytes on stage "));
  // What plans may fill of the 1 MiB (90%), and the whole.
  EXPECT_THAT(plan.status().message(), HasSubstr(", have 943718 (90% of 1048576)"));
  EXPECT_EQ(MakePlan(ModelProfile{}, Cluster(2, 0), PlanRequest{}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ParsePlannerKind("gpipe").status().message(), HasSubstr("2bw, pipedream, hippie"));
  EXPECT_EQ(*ParsePlannerKind("Hippie"), PlannerKind::kHippie);
}

}  // namespace
}  // namespace pipetrain::planner
