// The simulation that scores layouts, against step times and memory computed by hand: one
// stage; the (m + p - 1) bubble of GPipe and 1F1B; 2BW without a bubble; cores shared by
// every rank; the AllReduce with and without stage 0's overlap; activation memory with and
// without recomputation; bad layouts.
#include "runtime/planner/predict.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace pipetrain::planner {
namespace {

using schedule::ScheduleKind;
using ::testing::HasSubstr;

// `n` layers of forward f, backward 2f, optimizer `opt`, with the given bytes.
ModelProfile Uniform(int n, double f, double opt = 0) {
  ModelProfile profile;
  profile.tokens_per_sample = 10;
  MicroBatchProfile size;
  size.micro_batch_size = 1;
  for (int l = 0; l < n; ++l) {
    LayerProfile layer;
    layer.forward_s = f;
    layer.backward_s = 2 * f;
    layer.optimizer_s = opt;
    layer.output_bytes = 100;
    layer.parameter_bytes = 1000;
    layer.optimizer_bytes = 2000;
    layer.stash_bytes = 400;
    layer.working_bytes = 50;
    size.layers.push_back(layer);
  }
  profile.sizes.push_back(size);
  return profile;
}

Layout Even(ScheduleKind kind, int layers, int p, int m, int w = 1) {
  Layout layout;
  layout.schedule = kind;
  for (int s = 0; s < p; ++s) layout.stage_layers.emplace_back(s * layers / p, (s + 1) * layers / p);
  layout.micro_batches = m;
  layout.replicas = w;
  return layout;
}

ClusterProfile FreeLinks() {
  ClusterProfile cluster;
  cluster.workers = 8;
  cluster.link = {0, 1e30};
  return cluster;
}

TEST(Predict, OneStageRunsItsMicroBatchesBackToBack) {
  const ModelProfile profile = Uniform(4, 0.01, 0.005);
  absl::StatusOr<Prediction> p =
      Predict(profile, FreeLinks(), Even(ScheduleKind::kOneFOneB, 4, 1, 3));
  ASSERT_TRUE(p.ok()) << p.status();
  // 3 micro-batches x 4 layers x (f + 2f) + 4 layers' optimizer.
  EXPECT_NEAR(p->step_time_s, 3 * 4 * 0.03 + 4 * 0.005, 1e-12);
  EXPECT_NEAR(p->samples_per_s, 3 / p->step_time_s, 1e-9);
  EXPECT_NEAR(p->tokens_per_s, 30 / p->step_time_s, 1e-9);
}

TEST(Predict, FlushedSchedulesPayTheBubbleAndTwoBWDoesNot) {
  const ModelProfile profile = Uniform(8, 0.01);
  const double per_stage = 2 * 0.03;  // 2 layers of f + 2f per micro-batch
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB}) {
    absl::StatusOr<Prediction> p = Predict(profile, FreeLinks(), Even(kind, 8, 4, 6));
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_NEAR(p->step_time_s, (6 + 4 - 1) * per_stage, 1e-9) << ScheduleKindName(kind);
  }
  absl::StatusOr<Prediction> twobw =
      Predict(profile, FreeLinks(), Even(ScheduleKind::kTwoBW, 8, 4, 6));
  ASSERT_TRUE(twobw.ok()) << twobw.status();
  EXPECT_NEAR(twobw->step_time_s, 6 * per_stage, 1e-9);
}

TEST(Predict, RanksSharingOneCoreTakeTheSumOfTheirWork) {
  const ModelProfile profile = Uniform(4, 0.01, 0.002);
  ClusterProfile cluster = FreeLinks();
  cluster.shared_cores = 1;
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB}) {
    absl::StatusOr<Prediction> p = Predict(profile, cluster, Even(kind, 4, 2, 4));
    ASSERT_TRUE(p.ok()) << p.status();
    // Some stage always computes, and one core does all of it: 4 micro-batches x 4 layers x
    // 3f, plus every layer's optimizer.
    EXPECT_NEAR(p->step_time_s, 4 * 4 * 0.03 + 4 * 0.002, 1e-9) << ScheduleKindName(kind);
  }
  // Two cores for two ranks: as if each had its own.
  cluster.shared_cores = 2;
  absl::StatusOr<Prediction> shared = Predict(profile, cluster, Even(ScheduleKind::kOneFOneB, 4, 2, 4));
  absl::StatusOr<Prediction> own = Predict(profile, FreeLinks(), Even(ScheduleKind::kOneFOneB, 4, 2, 4));
  ASSERT_TRUE(shared.ok() && own.ok());
  EXPECT_NEAR(shared->step_time_s, own->step_time_s, 1e-12);
}

TEST(Predict, StageZeroHidesItsAllReduceBehindItsLastBackward) {
  // One layer: f = 1, b = 2; 1e6 parameter bytes whose AllReduce between 2 replicas takes 3 s.
  ModelProfile profile = Uniform(1, 1.0, 0.5);
  profile.sizes[0].layers[0].parameter_bytes = 1'000'000;
  ClusterProfile cluster = FreeLinks();
  cluster.allreduce = {0, 1e6 / 3};
  Layout layout = Even(ScheduleKind::kOneFOneB, 1, 1, 2, /*w=*/2);
  layout.overlap_allreduce = true;
  absl::StatusOr<Prediction> overlapped = Predict(profile, cluster, layout);
  ASSERT_TRUE(overlapped.ok()) << overlapped.status();
  // The last backward starts at 3 + 1 = 4 and ends at 6; the AllReduce started with it ends at
  // 7 (after 6 + the last 256 KiB bucket's 0.79 s): 1 s exposed, then the optimizer.
  EXPECT_NEAR(overlapped->stages[0].exposed_allreduce_s, 1.0, 1e-9);
  EXPECT_NEAR(overlapped->step_time_s, 7.5, 1e-9);
  EXPECT_NEAR(overlapped->stages[0].allreduce_s, 3.0, 1e-9);
  layout.overlap_allreduce = false;
  absl::StatusOr<Prediction> after = Predict(profile, cluster, layout);
  ASSERT_TRUE(after.ok());
  EXPECT_NEAR(after->stages[0].exposed_allreduce_s, 3.0, 1e-9);
  EXPECT_NEAR(after->step_time_s, 9.5, 1e-9);
}

TEST(Predict, MemoryCountsWeightsAndTheMicroBatchesInFlight) {
  const ModelProfile profile = Uniform(4, 0.01);
  absl::StatusOr<Prediction> p = Predict(profile, FreeLinks(), Even(ScheduleKind::kOneFOneB, 4, 2, 4));
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(p->stages.size(), 2u);
  // 1F1B holds p - s micro-batches: 2 on stage 0, 1 on stage 1.
  EXPECT_EQ(p->stages[0].peak_in_flight, 2);
  EXPECT_EQ(p->stages[1].peak_in_flight, 1);
  // Weights: 2 layers x (1 version + gradient) x 1000 + 2 x 2000 optimizer.
  EXPECT_EQ(p->stages[0].weight_bytes, 2 * 2 * 1000 + 2 * 2000);
  // Per micro-batch: its input (stage 1 only) + 2 layers x (stash 400 + output 100);
  // transient: the largest working_bytes (50).
  EXPECT_EQ(p->stages[0].activation_bytes, 2 * (2 * 500) + 50);
  EXPECT_EQ(p->stages[1].activation_bytes, 1 * (100 + 2 * 500) + 50);
  EXPECT_EQ(p->peak_memory_bytes, p->stages[0].peak_memory_bytes);
  // 2BW: two versions; GPipe: all m micro-batches in flight.
  absl::StatusOr<Prediction> twobw = Predict(profile, FreeLinks(), Even(ScheduleKind::kTwoBW, 4, 2, 4));
  ASSERT_TRUE(twobw.ok());
  EXPECT_EQ(twobw->stages[0].weight_bytes, 2 * 3 * 1000 + 2 * 2000);
  absl::StatusOr<Prediction> gpipe = Predict(profile, FreeLinks(), Even(ScheduleKind::kGPipe, 4, 2, 4));
  ASSERT_TRUE(gpipe.ok());
  EXPECT_EQ(gpipe->stages[1].peak_in_flight, 4);
  // Recomputing both layers of stage 0: per micro-batch only the run's output (100) stays;
  // its backward rebuilds 2 x 500 at a time.
  Layout recompute = Even(ScheduleKind::kOneFOneB, 4, 2, 4);
  recompute.recompute = {true, true, false, false};
  absl::StatusOr<Prediction> r = Predict(profile, FreeLinks(), recompute);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->stages[0].activation_bytes, 2 * 100 + 2 * 500 + 50);
  // And pays a forward again in each backward: 4 micro-batches x 2 layers x 0.01 more.
  absl::StatusOr<Prediction> plain = Predict(profile, FreeLinks(), Even(ScheduleKind::kOneFOneB, 4, 2, 4));
  EXPECT_NEAR(r->stages[0].compute_s - plain->stages[0].compute_s, 4 * 2 * 0.01, 1e-12);
}

TEST(Predict, BadLayoutsAreRefused) {
  const ModelProfile profile = Uniform(4, 0.01);
  Layout gap = Even(ScheduleKind::kOneFOneB, 4, 2, 4);
  gap.stage_layers[1].first = 3;
  EXPECT_THAT(Predict(profile, FreeLinks(), gap).status().message(), HasSubstr("contiguous"));
  Layout short_of = Even(ScheduleKind::kOneFOneB, 4, 2, 4);
  short_of.stage_layers[1].second = 3;
  EXPECT_THAT(Predict(profile, FreeLinks(), short_of).status().message(),
              HasSubstr("cover 3 of the model's 4 layers"));
  EXPECT_THAT(Predict(profile, FreeLinks(), Even(ScheduleKind::kTwoBW, 4, 4, 2)).status().message(),
              HasSubstr("m=2 < p=4"));
  EXPECT_FALSE(Predict(ModelProfile{}, FreeLinks(), Even(ScheduleKind::kOneFOneB, 4, 1, 1)).ok());
}

}  // namespace
}  // namespace pipetrain::planner
