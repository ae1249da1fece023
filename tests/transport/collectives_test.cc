// The collectives of Transport (AllGather, AllReduce, Broadcast, Barrier) among a replica's
// pipeline, some of its stages, and a stage's replicas, on the in-process transport and on
// Gloo (ranks as threads of this process over loopback TCP), checked against results computed
// here from every rank's contribution:
// - AllReduce combines in member order: the contributions 1e16, 1, -1e16 (in rank order) sum
//   to 0 only in that order (1 in the order 0, 2, 1: the negative control, computed here), and
//   every member gets the same bits;
// - a group of some stages runs among them alone while the other stages do something else;
// - a member that never comes makes the others fail by their deadline, naming the group; an
//   Abort() ends a wait with its reason.
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "runtime/rendezvous/key_value_store.h"
#include "runtime/transport/gloo/gloo_transport.h"
#include "runtime/transport/in_process/in_process_transport.h"

namespace pipetrain::transport {
namespace {

using ::testing::HasSubstr;

enum class Kind { kInProcess, kGloo };

std::string KindName(const testing::TestParamInfo<Kind>& info) {
  return info.param == Kind::kInProcess ? "InProcess" : "Gloo";
}

// Every rank of a job of `stages` x `replicas`, index rank = replica * stages + stage.
std::vector<std::unique_ptr<Transport>> MakeJob(Kind kind, int stages, int replicas) {
  const int ranks = stages * replicas;
  std::vector<std::unique_ptr<Transport>> out(static_cast<size_t>(ranks));
  if (kind == Kind::kInProcess) {
    auto hub = MakeInProcessHub();
    for (int r = 0; r < ranks; ++r) {
      out[static_cast<size_t>(r)] =
          MakeInProcessTransport(hub, r % stages, stages, r / stages, replicas);
    }
    return out;
  }
  std::shared_ptr<rendezvous::KeyValueStore> store = rendezvous::MakeMemoryStore();
  std::vector<std::future<std::unique_ptr<Transport>>> made;
  for (int r = 0; r < ranks; ++r) {
    made.push_back(std::async(std::launch::async, [=] {
      GlooTransportOptions o;
      o.stage = r % stages;
      o.stages = stages;
      o.replica = r / stages;
      o.replicas = replicas;
      o.connect_timeout = absl::Seconds(30);
      auto t = MakeGlooTransport(store, o);
      EXPECT_TRUE(t.ok()) << t.status();
      return t.ok() ? std::move(t).value() : nullptr;
    }));
  }
  for (int r = 0; r < ranks; ++r) out[static_cast<size_t>(r)] = made[static_cast<size_t>(r)].get();
  return out;
}

// Runs `body(rank)` on a thread per rank in `ranks` and waits for all.
template <typename F>
void OnEach(const std::vector<int>& ranks, F body) {
  std::vector<std::thread> threads;
  for (int r : ranks) threads.emplace_back([&body, r] { body(r); });
  for (auto& t : threads) t.join();
}

std::vector<int> All(int n) {
  std::vector<int> v;
  for (int i = 0; i < n; ++i) v.push_back(i);
  return v;
}

absl::Time Soon() { return absl::Now() + absl::Seconds(20); }

class Collectives : public testing::TestWithParam<Kind> {};

TEST_P(Collectives, AllReduceOverThePipelineSumsInRankOrderAlikeOnEveryMember) {
  auto job = MakeJob(GetParam(), 3, 2);
  for (const auto& t : job) ASSERT_NE(t, nullptr);
  const double parts[3] = {1e16, 1.0, -1e16};
  // The reference, here: in rank order 0; in another order 1 (the negative control).
  EXPECT_EQ((parts[0] + parts[1]) + parts[2], 0.0);
  EXPECT_EQ((parts[0] + parts[2]) + parts[1], 1.0);
  std::vector<at::Tensor> sums(6), maxima(6);
  OnEach(All(6), [&](int r) {
    const int stage = r % 3, replica = r / 3;
    // Replica 1's parts are replica 0's times 2, so that the replicas' pipelines differ.
    std::vector<at::Tensor> v = {torch::full({2}, parts[stage] * (1 + replica), torch::kDouble),
                                 torch::full({1}, static_cast<double>(stage), torch::kDouble)};
    absl::Status s = job[r]->AllReduce(Group::Pipeline(), v, ReduceOp::kSum, Soon());
    EXPECT_TRUE(s.ok()) << s;
    sums[r] = torch::cat({v[0], v[1]});
    std::vector<at::Tensor> m = {
        torch::full({1}, static_cast<double>(10 * stage - r), torch::kDouble)};
    s = job[r]->AllReduce(Group::Pipeline(), m, ReduceOp::kMax, Soon());
    EXPECT_TRUE(s.ok()) << s;
    maxima[r] = m[0];
  });
  for (int r = 0; r < 6; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    ASSERT_TRUE(sums[r].defined());
    EXPECT_EQ(sums[r][0].item<double>(), 0.0);
    EXPECT_EQ(sums[r][1].item<double>(), 0.0);
    EXPECT_EQ(sums[r][2].item<double>(), 0.0 + 1.0 + 2.0);
    // The max of 10 * stage - rank over the replica's ranks: stage 2's.
    const int replica = r / 3;
    EXPECT_EQ(maxima[r].item<double>(), 20.0 - (replica * 3 + 2));
  }
}

TEST_P(Collectives, AGroupOfSomeStagesRunsAmongThemAlone) {
  auto job = MakeJob(GetParam(), 4, 1);
  for (const auto& t : job) ASSERT_NE(t, nullptr);
  std::vector<at::Tensor> got(4);
  // Stages 0 and 3 (a tied embedding's copies) reduce twice while 1 and 2 reduce among
  // themselves, then all four meet in a barrier.
  OnEach(All(4), [&](int s) {
    const Group group =
        (s == 0 || s == 3) ? Group::PipelineStages({0, 3}) : Group::PipelineStages({1, 2});
    std::vector<at::Tensor> v = {torch::full({3}, static_cast<double>(s + 1), torch::kDouble)};
    for (int round = 0; round < 2; ++round) {
      absl::Status st = job[s]->AllReduce(group, v, ReduceOp::kSum, Soon());
      EXPECT_TRUE(st.ok()) << st;
    }
    got[s] = v[0];
    absl::Status st = job[s]->Barrier(Group::Pipeline(), Soon());
    EXPECT_TRUE(st.ok()) << st;
  });
  // Round one: 1 + 4 = 5 and 2 + 3 = 5; round two doubles it.
  for (int s = 0; s < 4; ++s)
    EXPECT_TRUE(torch::equal(got[s], torch::full({3}, 10.0, torch::kDouble)));
}

TEST_P(Collectives, ReplicasGatherBroadcastAndMeet) {
  auto job = MakeJob(GetParam(), 2, 3);
  for (const auto& t : job) ASSERT_NE(t, nullptr);
  std::vector<std::vector<at::Tensor>> gathered(6);
  std::vector<at::Tensor> broadcast(6);
  OnEach(All(6), [&](int r) {
    const int replica = r / 2;
    auto g = job[r]->AllGather(Group::Replicas(), torch::full({2}, 1.0 * r), Soon());
    EXPECT_TRUE(g.ok()) << g.status();
    if (g.ok()) gathered[r] = *g;
    std::vector<at::Tensor> b = {torch::full({2}, 100.0 + replica)};
    absl::Status s = job[r]->Broadcast(Group::Replicas(), b, 2, Soon());
    EXPECT_TRUE(s.ok()) << s;
    broadcast[r] = b[0];
  });
  for (int r = 0; r < 6; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    ASSERT_EQ(gathered[r].size(), 3u);
    for (int k = 0; k < 3; ++k) {  // replica k of this stage is rank k * 2 + stage
      EXPECT_TRUE(torch::equal(gathered[r][k], torch::full({2}, 1.0 * (k * 2 + r % 2))));
    }
    EXPECT_TRUE(torch::equal(broadcast[r], torch::full({2}, 102.0)));
  }
}

TEST_P(Collectives, ABarrierWaitsForTheLastMember) {
  auto job = MakeJob(GetParam(), 3, 1);
  for (const auto& t : job) ASSERT_NE(t, nullptr);
  std::atomic<bool> late_arrived{false};
  std::vector<bool> passed_before_late(3, true);
  OnEach(All(3), [&](int s) {
    if (s == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      late_arrived = true;
    }
    absl::Status st = job[s]->Barrier(Group::Pipeline(), Soon());
    EXPECT_TRUE(st.ok()) << st;
    passed_before_late[s] = !late_arrived.load();
  });
  for (int s = 0; s < 3; ++s) EXPECT_FALSE(passed_before_late[s]) << "stage " << s;
}

TEST_P(Collectives, AMemberThatNeverComesFailsTheOthersByTheirDeadline) {
  auto job = MakeJob(GetParam(), 3, 1);
  for (const auto& t : job) ASSERT_NE(t, nullptr);
  std::vector<absl::Status> status(2);
  const absl::Time start = absl::Now();
  OnEach({0, 1}, [&](int s) {
    std::vector<at::Tensor> v = {torch::ones({1})};
    status[s] = job[s]->AllReduce(Group::Pipeline(), v, ReduceOp::kSum,
                                  absl::Now() + absl::Milliseconds(500));
  });
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  for (const absl::Status& s : status) {
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("pipeline")) << s;
  }
  // As a failing stage does: its collective's work is let go, not waited out.
  for (const auto& t : job) t->Abort(absl::DeadlineExceededError("the test is over"));
}

TEST_P(Collectives, AbortEndsAWaitWithItsReason) {
  auto job = MakeJob(GetParam(), 2, 1);
  for (const auto& t : job) ASSERT_NE(t, nullptr);
  auto waiting = std::async(std::launch::async, [&] {
    return job[0]->Barrier(Group::Pipeline(), absl::Now() + absl::Seconds(60));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  job[0]->Abort(absl::CancelledError("stage 1 failed first"));
  ASSERT_EQ(waiting.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  const absl::Status s = waiting.get();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("stage 1 failed first"));
}

INSTANTIATE_TEST_SUITE_P(Transports, Collectives, testing::Values(Kind::kInProcess, Kind::kGloo),
                         KindName);

}  // namespace
}  // namespace pipetrain::transport
