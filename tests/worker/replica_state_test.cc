// The survivors' state a worker holds for a job's next generation (worker/held_state.h), and
// a rank taking its layers from it (worker/replica_state_fetch.h): from its own worker's
// hold, else over real gRPC from the holders' WorkerService (FetchLayerState, in chunks),
// each layer bitwise what the survivor held; a wrong key, a hold let go, a holder out of
// reach or a layer nobody holds are errors that name the layer (the rank then reads the
// checkpoint). The whole path, with real daemons, is tests/daemons/survivors_test.cc.
#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "runtime/checkpoint/layer_state.h"
#include "worker/held_state.h"
#include "worker/replica_state_fetch.h"
#include "worker/worker_service.h"

namespace pipetrain::worker {
namespace {

using ::testing::HasSubstr;

// A layer's state with `n` float64 parameters of `size` elements each, and AdamW state.
checkpoint::LayerState Layer(int n, int64_t size, double seed) {
  checkpoint::LayerState s;
  for (int i = 0; i < n; ++i) {
    at::Tensor p = torch::arange(size, torch::kFloat64) * (seed + i);
    s.parameters.push_back(p);
    weights::ParameterState opt;
    opt["exp_avg"] = p * 0.5;
    opt["exp_avg_sq"] = p * p;
    s.optimizer.push_back(opt);
  }
  return s;
}

bool Equal(const checkpoint::LayerState& a, const checkpoint::LayerState& b) {
  return checkpoint::SerializeLayerState(a) == checkpoint::SerializeLayerState(b);
}

TEST(HeldStates, ServesALayerOnlyWithItsKeyAtItsStep) {
  auto clock = std::make_shared<FakeClock>();
  HeldStates held(clock);
  held.Hold("job-1", 63, "key", absl::Minutes(1), {{4, "four"}, {5, "five"}});
  EXPECT_EQ(held.bytes(), 8);
  EXPECT_EQ(held.jobs(), 1);
  ASSERT_TRUE(held.Layer("job-1", 63, 4, "key").ok());
  EXPECT_EQ(**held.Layer("job-1", 63, 5, "key"), "five");
  EXPECT_TRUE(absl::IsPermissionDenied(held.Layer("job-1", 63, 4, "other").status()));
  EXPECT_TRUE(absl::IsPermissionDenied(held.Layer("job-1", 63, 4, "").status()));
  EXPECT_TRUE(absl::IsNotFound(held.Layer("job-1", 62, 4, "key").status()));
  EXPECT_TRUE(absl::IsNotFound(held.Layer("job-1", 63, 6, "key").status()));
  // A job without a hold answers as a wrong key does: nothing is learnt without the key.
  EXPECT_TRUE(absl::IsPermissionDenied(held.Layer("job-2", 63, 4, "key").status()));
  EXPECT_EQ(held.Layer("job-2", 63, 4, "key").status().message(),
            "no state of job-2 is held for this key (a wrong key, or the hold ended)");
  EXPECT_TRUE(held.Layer("job-1", 63, 4, "key").ok());
  EXPECT_FALSE(held.Layer("job-1", 63, 4, "other").ok());
}

TEST(HeldStates, ANewerHoldOfTheJobReplacesItsOlderOne) {
  auto clock = std::make_shared<FakeClock>();
  HeldStates held(clock);
  held.Hold("job-1", 63, "k1", absl::Minutes(1), {{0, "old"}});
  held.Hold("job-1", 90, "k2", absl::Minutes(1), {{0, "newer"}});
  EXPECT_FALSE(held.Layer("job-1", 63, 0, "k1").ok());
  EXPECT_EQ(**held.Layer("job-1", 90, 0, "k2"), "newer");
  EXPECT_EQ(held.bytes(), 5);
}

TEST(HeldStates, EndsWhenItsTimeIsUp) {
  auto clock = std::make_shared<FakeClock>();
  HeldStates held(clock);
  held.Hold("job-1", 63, "key", absl::Seconds(10), {{0, "state"}});
  clock->Advance(absl::Seconds(9));
  EXPECT_TRUE(held.Layer("job-1", 63, 0, "key").ok());
  clock->Advance(absl::Seconds(1));
  EXPECT_FALSE(held.Layer("job-1", 63, 0, "key").ok());
  EXPECT_EQ(held.jobs(), 0);
  EXPECT_EQ(held.bytes(), 0);
}

// A heartbeat's answer lets go of the holds of jobs it does not name, but only of those taken
// before the heartbeat was sent (the answer may not know of a newer one).
TEST(HeldStates, AHeartbeatAnswerLetsGoOfTheJobsItNoLongerNames) {
  auto clock = std::make_shared<FakeClock>();
  HeldStates held(clock);
  held.Hold("kept", 10, "k", absl::Minutes(5), {{0, "a"}});
  held.Hold("let-go", 10, "k", absl::Minutes(5), {{0, "b"}});
  clock->Advance(absl::Seconds(1));
  const absl::Time sent = clock->Now();
  clock->Advance(absl::Seconds(1));
  held.Hold("newer", 10, "k", absl::Minutes(5), {{0, "c"}});
  held.KeepOnly({"kept"}, sent);
  EXPECT_TRUE(held.Layer("kept", 10, 0, "k").ok());
  EXPECT_FALSE(held.Layer("let-go", 10, 0, "k").ok());
  EXPECT_TRUE(held.Layer("newer", 10, 0, "k").ok());  // taken after the heartbeat was sent
  held.KeepOnly({}, clock->Now() + absl::Seconds(1));
  EXPECT_EQ(held.jobs(), 0);
}

// A worker's WorkerService on loopback serving only FetchLayerState from `held`.
class Holder {
 public:
  explicit Holder(const HeldStates* held) : service_(nullptr, "command-key", held) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    address_ = "127.0.0.1:" + std::to_string(port);
  }
  ~Holder() { server_->Shutdown(); }
  const std::string& address() const { return address_; }

 private:
  WorkerServiceAdapter service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

v1::ReplicaState StateAt(int64_t step, const std::string& key,
                         const std::map<int, std::vector<std::string>>& holders) {
  v1::ReplicaState state;
  state.set_step(step);
  state.set_state_key(key);
  for (const auto& [layer, addresses] : holders) {
    v1::ReplicaState::LayerHolders* h = state.add_layers();
    h->set_layer(layer);
    for (const std::string& a : addresses) h->add_addresses(a);
  }
  return state;
}

class ReplicaStateFetchTest : public ::testing::Test {
 protected:
  ReplicaStateFetchTest() {
    // Layers 0-1 held here; 2-3 by the other worker; layer 3 over 1 MiB (several chunks).
    for (int layer = 0; layer < 4; ++layer) {
      states_.push_back(Layer(2, layer == 3 ? 100000 : 10, 1.5 + layer));
    }
    local_.Hold("job-1", 63, "key", absl::Minutes(1),
                {{0, checkpoint::SerializeLayerState(states_[0])},
                 {1, checkpoint::SerializeLayerState(states_[1])}});
    remote_.Hold("job-1", 63, "key", absl::Minutes(1),
                 {{2, checkpoint::SerializeLayerState(states_[2])},
                  {3, checkpoint::SerializeLayerState(states_[3])}});
    source_.job_id = "job-1";
    source_.own_address = "127.0.0.1:1";  // never called
    source_.local = &local_;
    source_.timeout = absl::Seconds(10);
  }
  std::shared_ptr<FakeClock> clock_ = std::make_shared<FakeClock>();
  HeldStates local_{clock_}, remote_{clock_};
  Holder holder_{&remote_};
  std::vector<checkpoint::LayerState> states_;
  ReplicaStateSource source_;
};

TEST_F(ReplicaStateFetchTest, TakesItsLayersFromItsOwnHoldAndFetchesTheRestBitwise) {
  const v1::ReplicaState state = StateAt(63, "key",
                                         {{0, {source_.own_address}},
                                          {1, {source_.own_address}},
                                          {2, {holder_.address()}},
                                          {3, {holder_.address()}}});
  ReplicaStateFetch report;
  absl::StatusOr<std::vector<checkpoint::LayerState>> got =
      FetchReplicaState(state, {{0, 2}, {2, 4}}, source_, &report);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 4u);
  for (int layer = 0; layer < 4; ++layer) EXPECT_TRUE(Equal((*got)[layer], states_[layer]));
  EXPECT_EQ(report.held_here, 2);
  EXPECT_EQ(report.fetched, 2);
  EXPECT_GT(report.bytes_fetched, int64_t{1} << 20);
  EXPECT_THAT(report.sources, ::testing::ElementsAre(holder_.address()));
  EXPECT_THAT(report.Describe(),
              HasSubstr("2 layers held here, 2 fetched from " + holder_.address()));
  // Negative control: the comparison tells layers apart.
  EXPECT_FALSE(Equal((*got)[2], states_[3]));
}

TEST_F(ReplicaStateFetchTest, AHolderOutOfReachIsPassedForTheNext) {
  source_.local = nullptr;
  // A port nobody listens on, first.
  const v1::ReplicaState state = StateAt(63, "key", {{2, {"127.0.0.1:9", holder_.address()}}});
  ReplicaStateFetch report;
  absl::StatusOr<std::vector<checkpoint::LayerState>> got =
      FetchReplicaState(state, {{2, 3}}, source_, &report);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(Equal(got->front(), states_[2]));
  EXPECT_EQ(report.held_here, 0);
  EXPECT_EQ(report.fetched, 1);
}

// The ranks of a place start at different holders (their replica, modulo the holders): with
// two holders of a layer, spread 0 fetches from the first and spread 1 from the second.
TEST_F(ReplicaStateFetchTest, TheRanksOfAPlaceStartAtDifferentHolders) {
  HeldStates second(clock_);
  second.Hold("job-1", 63, "key", absl::Minutes(1),
              {{2, checkpoint::SerializeLayerState(states_[2])}});
  Holder other(&second);
  source_.local = nullptr;
  const v1::ReplicaState state = StateAt(63, "key", {{2, {holder_.address(), other.address()}}});
  for (int spread : {0, 1, 2}) {
    source_.spread = spread;
    ReplicaStateFetch report;
    absl::StatusOr<std::vector<checkpoint::LayerState>> got =
        FetchReplicaState(state, {{2, 3}}, source_, &report);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(Equal(got->front(), states_[2]));
    EXPECT_THAT(report.sources,
                ::testing::ElementsAre(spread % 2 == 0 ? holder_.address() : other.address()))
        << spread;
  }
}

TEST_F(ReplicaStateFetchTest, AWrongKeyALayerNobodyHoldsOrAHoldLetGoIsAnErrorNamingTheLayer) {
  absl::StatusOr<std::vector<checkpoint::LayerState>> wrong_key = FetchReplicaState(
      StateAt(63, "other", {{2, {holder_.address()}}}), {{2, 3}}, source_, nullptr);
  ASSERT_FALSE(wrong_key.ok());
  EXPECT_THAT(wrong_key.status().message(), HasSubstr("layer 2"));
  EXPECT_THAT(wrong_key.status().message(), HasSubstr("PERMISSION_DENIED"));

  absl::StatusOr<std::vector<checkpoint::LayerState>> unheld =
      FetchReplicaState(StateAt(63, "key", {{2, {holder_.address()}}}), {{2, 6}}, source_, nullptr);
  ASSERT_FALSE(unheld.ok());
  EXPECT_THAT(unheld.status().message(), HasSubstr("no worker holds layer 3"));

  remote_.KeepOnly({}, clock_->Now() + absl::Seconds(1));  // the coordinator let it go
  absl::StatusOr<std::vector<checkpoint::LayerState>> let_go =
      FetchReplicaState(StateAt(63, "key", {{2, {holder_.address()}}}), {{2, 3}}, source_, nullptr);
  ASSERT_FALSE(let_go.ok());
  EXPECT_THAT(let_go.status().message(), HasSubstr("PERMISSION_DENIED"));
  EXPECT_THAT(let_go.status().message(), HasSubstr("the hold ended"));
}

}  // namespace
}  // namespace pipetrain::worker
