// The simulation that scores layouts, against step times and memory computed by hand: one
// stage; the (m + p - 1) bubble of GPipe and 1F1B; 2BW without a bubble; cores shared by
// every rank; what messages cost their sender, receiver and the transports' threads; the
// AllReduce with and without stage 0's overlap, on spare and on busy cores; activation
// memory with and without recomputation; bad layouts.
#include "runtime/planner/predict.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/planner/even_layout.h"

namespace pipetrain::planner {
namespace {

using schedule::ScheduleKind;
using ::testing::HasSubstr;

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

// The kinds whose every step drains a pipeline of one stage a rank (GPipe, 1F1B): a step
// pays the bubble of m + p - 1 micro-batch times.
bool FlushedWithoutChunks(ScheduleKind kind) {
  return schedule::WeightsOf(kind) == schedule::WeightPolicy::kFlush &&
         !schedule::HoldsChunks(kind);
}

TEST(Predict, FlushedSchedulesPayTheBubbleAndTwoBWDoesNot) {
  const ModelProfile profile = Uniform(8, 0.01);
  const double per_stage = 2 * 0.03;  // 2 layers of f + 2f per micro-batch
  for (const ScheduleKind kind : schedule::kScheduleKinds) {
    if (!FlushedWithoutChunks(kind)) continue;
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
  for (const ScheduleKind kind : schedule::kScheduleKinds) {
    if (!FlushedWithoutChunks(kind)) continue;
    absl::StatusOr<Prediction> p = Predict(profile, cluster, Even(kind, 4, 2, 4));
    ASSERT_TRUE(p.ok()) << p.status();
    // Some stage always computes, and one core does all of it: 4 micro-batches x 4 layers x
    // 3f, plus every layer's optimizer.
    EXPECT_NEAR(p->step_time_s, 4 * 4 * 0.03 + 4 * 0.002, 1e-9) << ScheduleKindName(kind);
  }
  // Two cores for two ranks: as if each had its own.
  cluster.shared_cores = 2;
  absl::StatusOr<Prediction> shared =
      Predict(profile, cluster, Even(ScheduleKind::kOneFOneB, 4, 2, 4));
  absl::StatusOr<Prediction> own =
      Predict(profile, FreeLinks(), Even(ScheduleKind::kOneFOneB, 4, 2, 4));
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
  layout.bucket_bytes = 256 << 10;
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

// Two stages of one layer each (f = 1, b = 2, no optimizer), one micro-batch per step.
Layout TwoStagesOneMicroBatch() { return Even(ScheduleKind::kGPipe, 2, 2, 1); }

TEST(Predict, MessagesCostTheirSenderTheirReceiverAndTheWay) {
  ModelProfile profile = Uniform(2, 1.0);
  // Every message: 0.1 s of the sender's CPU, 0.2 s of the receiver's, 0.5 s on the way.
  profile.message_costs = {{1, 0.1, 0.2, 0.0, 0.5}};
  absl::StatusOr<Prediction> p = Predict(profile, FreeLinks(), TwoStagesOneMicroBatch());
  ASSERT_TRUE(p.ok()) << p.status();
  // F0 ends at 1, its send at 1.1, the activation arrives at 1.6 and is taken by 1.8; F1 and
  // B1 end at 4.8, the gradient's send at 4.9, it arrives at 5.4 and is taken by 5.6; B0
  // ends at 7.6, and the next step starts there.
  EXPECT_NEAR(p->step_time_s, 7.6, 1e-9);
}

TEST(Predict, TheTransportsThreadsShareTheCoresWithTheRanks) {
  ModelProfile profile = Uniform(2, 1.0);
  // Instant messages whose transports take 0.3 s of CPU each.
  profile.message_costs = {{1, 0.1, 0.2, 0.3, 0.0}};
  ClusterProfile cluster = FreeLinks();
  cluster.shared_cores = 1;
  absl::StatusOr<Prediction> shared = Predict(profile, cluster, TwoStagesOneMicroBatch());
  ASSERT_TRUE(shared.ok()) << shared.status();
  // One core does all of it: 2 x (1 + 2) of the layers, 2 sends of 0.1, 2 receives of 0.2
  // and 2 x 0.3 of the transports' threads.
  EXPECT_NEAR(shared->step_time_s, 6 + 0.2 + 0.4 + 0.6, 1e-9);
  // With hardware of their own, the transports' threads cost the ranks nothing.
  absl::StatusOr<Prediction> own = Predict(profile, FreeLinks(), TwoStagesOneMicroBatch());
  ASSERT_TRUE(own.ok());
  EXPECT_NEAR(own->step_time_s, 6 + 0.2 + 0.4, 1e-9);
}

TEST(Predict, OverlappedBucketsTakeTheirCpuFromTheBackwardOnBusyCores) {
  // One layer: f = 1, b = 2, optimizer 0.5; 1e6 parameter bytes (4 buckets of 256 KiB) whose
  // AllReduce takes no time on the wire but, per rank, 0.25 s of CPU per call + 1 s per 1e6
  // bytes.
  ModelProfile profile = Uniform(1, 1.0, 0.5);
  profile.sizes[0].layers[0].parameter_bytes = 1'000'000;
  profile.allreduce_cpu = {0.25, 1e6};
  ClusterProfile cluster = FreeLinks();
  cluster.allreduce = {0, 1e30};
  cluster.shared_cores = 2;  // two replicas on two cores
  Layout layout = Even(ScheduleKind::kOneFOneB, 1, 1, 1, /*w=*/2);
  layout.overlap_allreduce = true;
  layout.bucket_bytes = 256 << 10;
  absl::StatusOr<Prediction> overlapped = Predict(profile, cluster, layout);
  ASSERT_TRUE(overlapped.ok()) << overlapped.status();
  // F takes 1; then each replica's backward (2) and its 4 buckets' CPU (4 x 0.25 + 1) share
  // its core: both end at 1 + 4 = 5; the optimizer ends the step at 5.5.
  EXPECT_NEAR(overlapped->step_time_s, 5.5, 1e-9);
  // Averaged at once after the backward: one call, 0.25 + 1 s, alone on the core: 4.75.
  layout.overlap_allreduce = false;
  absl::StatusOr<Prediction> after = Predict(profile, cluster, layout);
  ASSERT_TRUE(after.ok());
  EXPECT_NEAR(after->step_time_s, 1 + 2 + 1.25 + 0.5, 1e-9);
  // With cores to spare the overlap hides the buckets behind the backward: 3 + 0.5.
  layout.overlap_allreduce = true;
  cluster.shared_cores = 0;
  absl::StatusOr<Prediction> spare = Predict(profile, cluster, layout);
  ASSERT_TRUE(spare.ok());
  EXPECT_NEAR(spare->step_time_s, 3.5, 1e-9);
}

TEST(MessageCostAt, InterpolatesBetweenMeasuredSizesAndExtrapolatesBeyond) {
  const std::vector<MessageCost> costs = {{100, 1, 2, 3, 4}, {300, 3, 2, 5, 8}};
  MessageCost at = MessageCostAt(costs, 200);
  EXPECT_DOUBLE_EQ(at.send_s, 2);
  EXPECT_DOUBLE_EQ(at.recv_s, 2);
  EXPECT_DOUBLE_EQ(at.background_s, 4);
  EXPECT_DOUBLE_EQ(at.latency_s, 6);
  EXPECT_DOUBLE_EQ(MessageCostAt(costs, 50).send_s, 1);   // below the first: the first
  EXPECT_DOUBLE_EQ(MessageCostAt(costs, 500).send_s, 5);  // beyond: as between the last two
  EXPECT_DOUBLE_EQ(MessageCostAt({}, 500).background_s, 0);
}

TEST(Predict, MemoryCountsWeightsAndTheMicroBatchesInFlight) {
  const ModelProfile profile = Uniform(4, 0.01);
  absl::StatusOr<Prediction> p =
      Predict(profile, FreeLinks(), Even(ScheduleKind::kOneFOneB, 4, 2, 4));
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(p->stages.size(), 2u);
  // 1F1B holds p - s micro-batches: 2 on stage 0, 1 on stage 1.
  EXPECT_EQ(p->stages[0].peak_in_flight, 2);
  EXPECT_EQ(p->stages[1].peak_in_flight, 1);
  // Weights: 2 layers x 1 version x 1000 + 2 x 2000 optimizer.
  EXPECT_EQ(p->stages[0].weight_bytes, 2 * 1000 + 2 * 2000);
  // Per micro-batch: its input (stage 1 only) + 2 layers x (stash 400 + output 100). Once the
  // first backward has made the gradient (2 x 1000), stage 0 runs a backward with another
  // micro-batch waiting, stage 1 with none; the backward's first layer (the stage's last)
  // runs with its whole micro-batch still there and its working bytes (50).
  EXPECT_EQ(p->stages[0].activation_bytes, 2 * (2 * 500) + 2000 + 50);
  EXPECT_EQ(p->stages[1].activation_bytes, 1 * (100 + 2 * 500) + 2000 + 50);
  EXPECT_EQ(p->peak_memory_bytes, p->stages[0].peak_memory_bytes);
  // One micro-batch a step: its backward frees the stash layer by layer as the gradient
  // appears layer by layer; the most is at layer 0: its own stash and output (500), its
  // working bytes and all four layers' gradients.
  absl::StatusOr<Prediction> one =
      Predict(profile, FreeLinks(), Even(ScheduleKind::kOneFOneB, 4, 1, 1));
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->stages[0].activation_bytes, 500 + 50 + 4 * 1000);
  // Two replicas: the AllReduce averages a flat copy of the gradient. At the update, the
  // gradient and its copy (2 x 4000) outweigh layer 0's backward; overlapped with the
  // backward (stage 0), the copies of layers 3, 2 and 1 stand beside layer 0's backward
  // (500 + 50 + 4000 + 3000), and at its end the whole gradient and its copy.
  Layout replicated = Even(ScheduleKind::kOneFOneB, 4, 1, 1, 2);
  replicated.overlap_allreduce = false;
  absl::StatusOr<Prediction> at_update = Predict(profile, FreeLinks(), replicated);
  ASSERT_TRUE(at_update.ok());
  EXPECT_EQ(at_update->stages[0].activation_bytes, 2 * 4000);
  replicated.overlap_allreduce = true;
  replicated.SetStageLayers({{0, 2}, {2, 4}});
  absl::StatusOr<Prediction> during = Predict(profile, FreeLinks(), replicated);
  ASSERT_TRUE(during.ok());
  // Stage 0 (layers 0-1), one micro-batch: at layer 0, its stash and output (500), working
  // (50), both gradients (2000) and layer 1's copy (1000); at the end 2 x 2000. Stage 1
  // averages at its update: 2 x 2000 too, above its backward (100 + 500 + 50 + 2000).
  EXPECT_EQ(during->stages[0].activation_bytes, std::max(500 + 50 + 2000 + 1000, 2 * 2000));
  EXPECT_EQ(during->stages[1].activation_bytes, 2 * 2000);
  // 2BW: two versions; GPipe: all m micro-batches in flight, the gradient only once they
  // are going back: 3 waiting, and the first going back, at its last layer (layer 2): its
  // input and layer 2's stash and output (600), the working bytes and both gradients.
  absl::StatusOr<Prediction> twobw =
      Predict(profile, FreeLinks(), Even(ScheduleKind::kTwoBW, 4, 2, 4));
  ASSERT_TRUE(twobw.ok());
  EXPECT_EQ(twobw->stages[0].weight_bytes, 2 * 2 * 1000 + 2 * 2000);
  absl::StatusOr<Prediction> gpipe =
      Predict(profile, FreeLinks(), Even(ScheduleKind::kGPipe, 4, 2, 4));
  ASSERT_TRUE(gpipe.ok());
  EXPECT_EQ(gpipe->stages[1].peak_in_flight, 4);
  EXPECT_EQ(gpipe->stages[1].activation_bytes, 3 * 1100 + 600 + 50 + 2 * 1000);
  // Recomputing both layers of stage 0: per micro-batch only the run's output (100) stays;
  // its backward rebuilds 2 x 500 at once, with the other micro-batch waiting.
  Layout recompute = Even(ScheduleKind::kOneFOneB, 4, 2, 4);
  recompute.recompute = {true, true, false, false};
  absl::StatusOr<Prediction> r = Predict(profile, FreeLinks(), recompute);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->stages[0].activation_bytes, 2 * 100 + 2000 + 2 * 500 + 50);
  // And pays a forward again in each backward: 4 micro-batches x 2 layers x 0.01 more.
  absl::StatusOr<Prediction> plain =
      Predict(profile, FreeLinks(), Even(ScheduleKind::kOneFOneB, 4, 2, 4));
  EXPECT_NEAR(r->stages[0].compute_s - plain->stages[0].compute_s, 4 * 2 * 0.01, 1e-12);
}

TEST(Predict, BadLayoutsAreRefused) {
  const ModelProfile profile = Uniform(4, 0.01);
  Layout gap = Even(ScheduleKind::kOneFOneB, 4, 2, 4);
  gap.pipeline.stage_layers[1].first = 3;
  EXPECT_THAT(Predict(profile, FreeLinks(), gap).status().message(), HasSubstr("contiguous"));
  Layout short_of = Even(ScheduleKind::kOneFOneB, 4, 2, 4);
  short_of.pipeline.stage_layers[1].second = 3;
  EXPECT_THAT(Predict(profile, FreeLinks(), short_of).status().message(),
              HasSubstr("cover 3 of the model's 4 layers"));
  // The stage count and the ranges kept apart (not through SetStageLayers) disagree.
  Layout miscounted = Even(ScheduleKind::kOneFOneB, 4, 2, 4);
  miscounted.pipeline.stage_layers.pop_back();
  EXPECT_THAT(Predict(profile, FreeLinks(), miscounted).status().message(),
              HasSubstr("a layout of 2 stages has 1 layer ranges"));
  EXPECT_THAT(Predict(profile, FreeLinks(), Even(ScheduleKind::kTwoBW, 4, 4, 2)).status().message(),
              HasSubstr("m=2 < p=4"));
  EXPECT_FALSE(Predict(ModelProfile{}, FreeLinks(), Even(ScheduleKind::kOneFOneB, 4, 1, 1)).ok());
}

}  // namespace
}  // namespace pipetrain::planner
