// The links of a pipeline (boundary_links.h), for every way the schedules place their model
// stages: every message the executor sends across a boundary (its numbers n x v + floor(m / p),
// its kinds) is routed to one link of that boundary and direction (the sender and the
// receiver ask LinkOf the same question), and no two boundaries, directions or lanes share
// one. Negative control: with one link a direction
// between two ranks, as before, several boundaries would share one wherever a rank holds
// several model stages (checked).
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "runtime/schedule/chunked_schedule.h"
#include "runtime/transport/boundary_links.h"

namespace pipetrain::transport {
namespace {

struct Case {
  schedule::ChunkPlacement placement;
  int ranks, chunks;
};

TransportOptions OptionsOf(const Case& c) {
  schedule::ChunkLayout layout{c.placement, c.ranks, c.chunks};
  TransportOptions o;
  o.stages = c.ranks;
  for (int m = 0; m < layout.stages(); ++m) o.model_stage_holders.push_back(layout.RankOf(m));
  return o;
}

TEST(BoundaryLinks, EveryBoundaryDirectionAndLaneHasALinkOfItsOwn) {
  for (const Case c :
       {Case{schedule::ChunkPlacement::kLoop, 4, 1}, Case{schedule::ChunkPlacement::kLoop, 2, 2},
        Case{schedule::ChunkPlacement::kLoop, 4, 3}, Case{schedule::ChunkPlacement::kLoop, 2, 4},
        Case{schedule::ChunkPlacement::kV, 2, 2}, Case{schedule::ChunkPlacement::kV, 4, 2}}) {
    SCOPED_TRACE(absl::StrCat(c.placement == schedule::ChunkPlacement::kV ? "V" : "loop",
                              " p=", c.ranks, " v=", c.chunks));
    const TransportOptions o = OptionsOf(c);
    const std::vector<BoundaryLink> links = PipelineLinks(o, /*evaluation_links=*/true);
    const int p = c.ranks, v = c.chunks, stages = p * v;
    std::set<int> used;
    int boundaries = 0;
    for (int m = 0; m + 1 < stages; ++m) {
      const int lower = o.model_stage_holders[m], upper = o.model_stage_holders[m + 1];
      if (lower == upper) continue;  // V's turn: within one rank
      ++boundaries;
      for (const MessageKind kind : kMessageKinds) {
        const bool forward = FlowsForward(kind);
        const int from = forward ? lower : upper, to = forward ? upper : lower;
        std::set<int> of_this;
        for (int64_t n = 0; n < 5; ++n) {
          const int64_t number = n * v + m / p;  // StageExecutor::MessageKey
          const int link = LinkOf(links, v, from, to, kind, number);
          ASSERT_GE(link, 0) << "boundary " << m << " " << MessageKindName(kind);
          EXPECT_EQ(links[link].boundary, m);
          EXPECT_EQ(links[link].from(), from);
          EXPECT_EQ(links[link].to(), to);
          of_this.insert(link);
        }
        EXPECT_EQ(of_this.size(), 1u) << "one boundary's messages on one link";
        used.insert(*of_this.begin());
      }
    }
    // Forward and back, training and evaluation: four links a boundary, all of them used.
    EXPECT_EQ(static_cast<int>(links.size()), 4 * boundaries);
    EXPECT_EQ(used.size(), links.size());
    // The negative control: one link a direction between two ranks (and lane) would carry
    // several boundaries' messages wherever ranks hold several model stages.
    std::map<std::tuple<int, int, bool>, int> by_direction;
    for (const BoundaryLink& l : links) ++by_direction[{l.from(), l.to(), l.evaluation}];
    int shared = 0;
    for (const auto& [key, n] : by_direction) shared += n > 1 ? 1 : 0;
    EXPECT_EQ(shared > 0, v > 1);
  }
}

TEST(BoundaryLinks, WithoutEvaluationLinksOnlyTrainingsAndNoneWithinARank) {
  const TransportOptions o = OptionsOf({schedule::ChunkPlacement::kV, 2, 2});
  const std::vector<BoundaryLink> links = PipelineLinks(o, false);
  ASSERT_EQ(links.size(), 4u);  // boundaries 0-1 and 2-3; 1-2 is rank 1's own turn
  for (const BoundaryLink& l : links) {
    EXPECT_FALSE(l.evaluation);
    EXPECT_NE(l.boundary, 1);
  }
  EXPECT_EQ(LinkOf(links, 2, 0, 1, MessageKind::kEvalActivation, 0), -1);
  EXPECT_EQ(links[0].Name(o, 0),
            "the link for activations to stage 1 (rank 1) across boundary 0-1");
}

}  // namespace
}  // namespace pipetrain::transport
