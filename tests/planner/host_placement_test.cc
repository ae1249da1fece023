// Ranks on hosts: the simulation against step times computed by hand for a stage boundary and
// an AllReduce that cross hosts (and the same on one host, the negative control), the
// placement against brute force over every assignment of ranks to hosts, FillHosts's groups,
// and the planner keeping the placement it scored.
#include "runtime/planner/host_placement.h"

#include <algorithm>
#include <functional>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/planner/planners.h"
#include "runtime/planner/profile_json.h"
#include "tests/planner/even_layout.h"

namespace pipetrain::planner {
namespace {

using schedule::ScheduleKind;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// `n` layers of forward f and backward 2f with the given output and parameter bytes.
ModelProfile Layers(int n, double f, int64_t output_bytes, int64_t parameter_bytes) {
  ModelProfile profile;
  MicroBatchProfile size;
  for (int l = 0; l < n; ++l) {
    LayerProfile layer;
    layer.forward_s = f;
    layer.backward_s = 2 * f;
    layer.output_bytes = output_bytes;
    layer.parameter_bytes = parameter_bytes;
    size.layers.push_back(layer);
  }
  profile.sizes.push_back(size);
  return profile;
}

// Even layouts (even_layout.h) with the AllReduce after the backward: its whole time shows.
Layout AveragedAfterBackward(ScheduleKind kind, int layers, int p, int m, int w) {
  Layout layout = Even(kind, layers, p, m, w);
  layout.overlap_allreduce = false;
  return layout;
}

// Two hosts of `per_host` workers: free links within a host, a slow one between them.
ClusterProfile TwoHosts(int per_host, LinkProfile between) {
  ClusterProfile cluster;
  cluster.workers = 2 * per_host;
  cluster.link = {0, 1e30};
  cluster.allreduce = {0, 1e30};
  cluster.host_workers = {per_host, per_host};
  cluster.between_hosts = between;
  return cluster;
}

double StepTime(const ModelProfile& profile, const ClusterProfile& cluster, Layout layout,
                std::vector<int> rank_hosts) {
  layout.rank_hosts = std::move(rank_hosts);
  absl::StatusOr<Prediction> p = Predict(profile, cluster, layout);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? p->step_time_s : -1;
}

TEST(HostPlacement, AStageBoundaryBetweenHostsCostsTheirLinkBothWays) {
  const ModelProfile profile = Layers(2, 0.01, 5000, 0);
  const LinkProfile between{0.002, 1e6};  // 2 ms + 5 ms for 5000 bytes
  const ClusterProfile cluster = TwoHosts(2, between);
  const Layout layout = AveragedAfterBackward(ScheduleKind::kGPipe, 2, 2, 1, 1);
  const double together = StepTime(profile, cluster, layout, {0, 0});
  const double apart = StepTime(profile, cluster, layout, {0, 1});
  // One micro-batch through two stages and back: f, f, 2f, 2f; apart, the activation and its
  // gradient each cross once more.
  EXPECT_NEAR(together, 6 * 0.01, 1e-12);
  EXPECT_NEAR(apart - together, 2 * (0.002 + 5000 / 1e6), 1e-12);
}

// Replicas run one timeline: where several send the same boundary's message over one link at
// once, they share its bandwidth; over links of their own (the control) they do not.
TEST(HostPlacement, ReplicasCrossingOneLinkAtOnceShareItsBandwidth) {
  const ModelProfile profile = Layers(2, 0.01, 5000, 0);
  const LinkProfile between{0.002, 1e6};  // 2 ms + 5 ms for 5000 bytes
  ClusterProfile cluster = TwoHosts(2, between);
  cluster.between_hosts_allreduce = {0, 1e30};  // rings that span hosts cost nothing here
  const Layout layout = AveragedAfterBackward(ScheduleKind::kGPipe, 2, 2, 1, 2);
  // rank = replica x 2 + stage: both replicas' boundaries from host 0 to host 1.
  const double together = StepTime(profile, cluster, layout, {0, 0, 1, 1});
  const double one_link = StepTime(profile, cluster, layout, {0, 1, 0, 1});
  EXPECT_NEAR(together, 6 * 0.01, 1e-12);
  EXPECT_NEAR(one_link - together, 2 * (0.002 + 2 * 5000 / 1e6), 1e-12);
  // Four hosts of one: each replica crosses a link of its own (0 -> 1, 2 -> 3).
  cluster.host_workers = {1, 1, 1, 1};
  EXPECT_NEAR(StepTime(profile, cluster, layout, {0, 1, 2, 3}) - together, 2 * (0.002 + 5000 / 1e6),
              1e-12);
  // Opposite directions of one link (0 -> 1 and 1 -> 0) do not share either.
  cluster.host_workers = {2, 2};
  EXPECT_NEAR(StepTime(profile, cluster, layout, {0, 1, 1, 0}) - together, 2 * (0.002 + 5000 / 1e6),
              1e-12);
  EXPECT_EQ(ReplicasSharingLink(
                [&] {
                  Layout l = layout;
                  l.rank_hosts = {0, 1, 0, 1};
                  return l;
                }(),
                0, 1),
            2);
}

TEST(HostPlacement, AnAllReduceRingThatSpansHostsRunsAtTheirLink) {
  const ModelProfile profile = Layers(1, 0.01, 10, 1'000'000);
  ClusterProfile cluster = TwoHosts(2, {0.001, 1e6});
  cluster.between_hosts_allreduce = {0.003, 2e6};
  const Layout layout = AveragedAfterBackward(ScheduleKind::kOneFOneB, 1, 1, 1, 2);
  const double together = StepTime(profile, cluster, layout, {0, 0});
  const double apart = StepTime(profile, cluster, layout, {0, 1});
  // w = 2: 2 (w - 1) steps of latency + (bytes / w) / bandwidth.
  EXPECT_NEAR(together, 0.03, 1e-9);
  EXPECT_NEAR(apart - together, 2 * (0.003 + 500'000 / 2e6), 1e-9);
  // Without an AllReduce link of its own the ring takes the hosts' message link.
  cluster.between_hosts_allreduce = {0, 0};
  EXPECT_NEAR(StepTime(profile, cluster, layout, {0, 1}) - together, 2 * (0.001 + 500'000 / 1e6),
              1e-9);
}

TEST(HostPlacement, FillHostsKeepsGroupsWholeOnTheTightestHostThatHoldsThem) {
  model::PipelineLayout two_by_two;
  two_by_two.stages = 2;
  two_by_two.replicas = 2;
  // rank = replica x 2 + stage.
  EXPECT_THAT(*FillHosts(two_by_two, {2, 2}, HostOrder::kPipelines), ElementsAre(0, 0, 1, 1));
  EXPECT_THAT(*FillHosts(two_by_two, {2, 2}, HostOrder::kStages), ElementsAre(0, 1, 0, 1));
  EXPECT_THAT(*FillHosts(two_by_two, {3, 3}, HostOrder::kStages), ElementsAre(0, 1, 0, 1));
  // Replica 0 whole on the only host with two; replica 1 split over the others.
  EXPECT_THAT(*FillHosts(two_by_two, {1, 1, 2}, HostOrder::kPipelines), ElementsAre(2, 2, 0, 1));
  absl::StatusOr<std::vector<int>> short_of_workers =
      FillHosts(two_by_two, {1, 2}, HostOrder::kStages);
  EXPECT_THAT(short_of_workers.status().message(), HasSubstr("4 ranks; the hosts have 3"));
}

// Every assignment of the layout's ranks to the hosts that fits their sizes.
std::vector<std::vector<int>> EveryAssignment(int ranks, const std::vector<int>& host_workers) {
  std::vector<std::vector<int>> all;
  std::vector<int> current, used(host_workers.size(), 0);
  std::function<void()> extend = [&] {
    if (static_cast<int>(current.size()) == ranks) {
      all.push_back(current);
      return;
    }
    for (size_t h = 0; h < host_workers.size(); ++h) {
      if (used[h] == host_workers[h]) continue;
      ++used[h];
      current.push_back(static_cast<int>(h));
      extend();
      current.pop_back();
      --used[h];
    }
  };
  extend();
  return all;
}

// The heavier traffic stays within hosts: a model of large parameters keeps each stage's
// replicas together, one of large activations each replica's stages; in both the chosen
// placement is as fast as the best of every assignment, and the other order is slower (the
// negative control: were hosts ignored, every assignment would predict the same).
TEST(HostPlacement, TheHeavierTrafficStaysWithinHostsAsFastAsTheBestOfEveryAssignment) {
  const ClusterProfile cluster = TwoHosts(2, {0.0005, 25e6});
  struct Case {
    const char* model;
    ModelProfile profile;
    HostOrder expected;
    std::vector<int> rank_hosts;
  };
  const Case cases[] = {
      {"large parameters", Layers(4, 0.002, 4'000, 2'000'000), HostOrder::kStages, {0, 1, 0, 1}},
      {"large activations",
       Layers(4, 0.002, 2'000'000, 4'000),
       HostOrder::kPipelines,
       {0, 0, 1, 1}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.model);
    const Layout layout = AveragedAfterBackward(ScheduleKind::kOneFOneB, 4, 2, 4, 2);
    absl::StatusOr<std::vector<HostPlacement>> placements =
        RankHostPlacements(c.profile, cluster, layout);
    ASSERT_TRUE(placements.ok()) << placements.status();
    ASSERT_EQ(placements->size(), 2u);
    EXPECT_EQ(placements->front().order, c.expected);
    EXPECT_EQ(placements->front().rank_hosts, c.rank_hosts);
    EXPECT_GT(placements->back().prediction.step_time_s,
              1.2 * placements->front().prediction.step_time_s);
    double best = 1e30, worst = 0;
    for (const std::vector<int>& assignment : EveryAssignment(4, cluster.host_workers)) {
      const double t = StepTime(c.profile, cluster, layout, assignment);
      best = std::min(best, t);
      worst = std::max(worst, t);
    }
    EXPECT_NEAR(placements->front().prediction.step_time_s, best, 1e-12);
    EXPECT_GT(worst, 1.2 * best);
  }
}

TEST(HostPlacement, OneHostHasOnePlacementAndPredictRefusesOnesThatDoNotFit) {
  const ModelProfile profile = Layers(2, 0.01, 100, 100);
  ClusterProfile one_host;
  one_host.workers = 4;
  one_host.link = {0, 1e9};
  const Layout layout = AveragedAfterBackward(ScheduleKind::kOneFOneB, 2, 2, 2, 2);
  absl::StatusOr<std::vector<HostPlacement>> placements =
      RankHostPlacements(profile, one_host, layout);
  ASSERT_TRUE(placements.ok()) << placements.status();
  ASSERT_EQ(placements->size(), 1u);
  EXPECT_TRUE(placements->front().rank_hosts.empty());

  const ClusterProfile two = TwoHosts(2, {0, 1e6});
  Layout bad = layout;
  bad.rank_hosts = {0, 0, 0, 1};
  EXPECT_THAT(Predict(profile, two, bad).status().message(),
              HasSubstr("puts 3 ranks on host 0, which has 2 workers"));
  bad.rank_hosts = {0, 1};
  EXPECT_THAT(Predict(profile, two, bad).status().message(), HasSubstr("names 2 ranks"));
  bad.rank_hosts = {0, 1, 2, 1};
  EXPECT_THAT(Predict(profile, two, bad).status().message(), HasSubstr("names host 2"));
}

// The planner scores each layout on its fastest placement and keeps it; with the same
// workers on one host it places nothing.
TEST(HostPlacement, ThePlannerKeepsThePlacementItScored) {
  const ModelProfile profile = Layers(4, 0.002, 4'000, 2'000'000);
  const ClusterProfile cluster = TwoHosts(2, {0.0005, 25e6});
  PlanRequest request;
  request.planner = PlannerKind::kPipeDream;
  request.global_batch = 8;
  request.micro_batch_sizes = {2};
  absl::StatusOr<PlanResult> plan = MakePlan(profile, cluster, request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const Layout& chosen = plan->chosen.layout;
  ASSERT_EQ(static_cast<int>(chosen.rank_hosts.size()), chosen.pipeline.ranks());
  absl::StatusOr<Prediction> again = Predict(profile, cluster, chosen);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_NEAR(again->step_time_s, plan->chosen.prediction.step_time_s, 1e-12);
  for (const std::vector<int>& assignment :
       EveryAssignment(chosen.pipeline.ranks(), cluster.host_workers)) {
    EXPECT_GE(StepTime(profile, cluster, chosen, assignment),
              plan->chosen.prediction.step_time_s * (1 - 1e-9));
  }

  ClusterProfile one_host = cluster;
  one_host.host_workers.clear();
  absl::StatusOr<PlanResult> flat = MakePlan(profile, one_host, request);
  ASSERT_TRUE(flat.ok()) << flat.status();
  EXPECT_TRUE(flat->chosen.layout.rank_hosts.empty());
  ClusterProfile miscounted = cluster;
  miscounted.host_workers = {2, 1};
  EXPECT_THAT(MakePlan(profile, miscounted, request).status().message(),
              HasSubstr("the hosts have 3 workers; the cluster has 4"));
}

// The links between hosts survive JSON alone and in a profile, which without them has none.
TEST(HostPlacement, HostLinksSurviveJsonAloneAndInAProfile) {
  HostLinks links;
  links.p2p = {2e-4, 3e7};
  links.allreduce = {3e-4, 2e7};
  absl::StatusOr<HostLinks> back = HostLinksFromJson(HostLinksToJson(links));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->p2p.latency_s, 2e-4);
  EXPECT_EQ(back->allreduce.bytes_per_s, 2e7);
  EXPECT_THAT(
      HostLinksFromJson(R"({"p2p": {"latency_s": 0, "bytes_per_s": 0}})").status().message(),
      HasSubstr("p2p.bytes_per_s: must be > 0"));

  ModelProfile profile = Layers(2, 0.01, 100, 100);
  profile.p2p = {1e-5, 1e9};
  profile.allreduce = {1e-5, 1e9};
  const std::string without = ModelProfileToJson(profile);
  EXPECT_EQ(without.find("between_hosts"), std::string::npos);
  absl::StatusOr<ModelProfile> plain = ModelProfileFromJson(without);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->between_hosts.measured());
  profile.between_hosts = links;
  absl::StatusOr<ModelProfile> with = ModelProfileFromJson(ModelProfileToJson(profile));
  ASSERT_TRUE(with.ok()) << with.status();
  EXPECT_EQ(with->between_hosts.p2p.bytes_per_s, 3e7);
  EXPECT_EQ(with->between_hosts.allreduce.latency_s, 3e-4);
}

}  // namespace
}  // namespace pipetrain::planner
