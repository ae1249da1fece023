// The worker's rules against a fake coordinator behind its CoordinatorClient seam, a fake
// that can lose a request (never applied) or lose its reply (applied, the caller told
// nothing), as a flaky network would: registration retried, a refused token not; a worker
// the coordinator forgot registers again; an assignment that arrives before the
// registration's reply waits for it and runs; step reports whose replies were lost are sent
// again, in order; a stage end is retried; a worker stopping while its rank runs says why
// before it leaves; a drain that races its stage ends with it. The worker serves real gRPC
// on loopback and runs a real one-stage job.
#include "worker/worker.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "jobspec/spec_yaml.h"
#include "pipetrain/v1/worker_service.grpc.pb.h"
#include "rpc/security.h"
#include "worker/coordinator_client.h"

namespace pipetrain::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The calls a worker makes, for the chaos switches.
enum class Call { kRegister, kHeartbeat, kReportSteps, kStageEnd, kDrain, kDeregister };

class FakeCoordinator : public CoordinatorClient {
 public:
  // The next `n` calls of `call` are lost on the way there (UNAVAILABLE, nothing applied).
  void LoseRequests(Call call, int n) {
    std::lock_guard<std::mutex> lock(mu_);
    lose_request_[call] = n;
  }
  // The next `n` calls of `call` are applied, but their replies are lost (DEADLINE_EXCEEDED).
  void LoseReplies(Call call, int n) {
    std::lock_guard<std::mutex> lock(mu_);
    lose_reply_[call] = n;
  }
  // Registrations are refused with `status` (a wrong token).
  void RefuseRegistrations(absl::Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    refuse_ = std::move(status);
  }
  // Registrations wait (the reply is slow) until Release().
  void HoldRegistrations() {
    std::lock_guard<std::mutex> lock(mu_);
    hold_ = true;
  }
  void Release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      hold_ = false;
    }
    changed_.notify_all();
  }
  // As a restarted coordinator: no worker is known any more.
  void Forget() {
    std::lock_guard<std::mutex> lock(mu_);
    known_.clear();
  }
  // Waits up to 20 s for `done` (under the fake's lock).
  bool WaitFor(const std::function<bool()>& done) {
    std::unique_lock<std::mutex> lock(mu_);
    return changed_.wait_for(lock, std::chrono::seconds(20), done);
  }

  absl::StatusOr<v1::RegisterWorkerResponse> Register(
      const v1::RegisterWorkerRequest& request) override {
    std::unique_lock<std::mutex> lock(mu_);
    ++attempts_[Call::kRegister];
    if (Lost(lose_request_, Call::kRegister)) return absl::UnavailableError("lost on the way");
    if (!refuse_.ok()) return refuse_;
    registrations.push_back(request);
    changed_.notify_all();
    changed_.wait(lock, [this] { return !hold_; });
    const std::string id = absl::StrCat("worker-", registrations.size());
    known_.insert(id);
    v1::RegisterWorkerResponse response;
    response.set_worker_id(id);
    response.set_session(absl::StrCat("session-", registrations.size()));
    response.set_heartbeat_interval_ms(50);
    response.set_lease_ms(150);
    if (Lost(lose_reply_, Call::kRegister)) return absl::DeadlineExceededError("reply lost");
    return response;
  }
  absl::Status Heartbeat(const v1::HeartbeatRequest& request, absl::Duration,
                         v1::HeartbeatResponse*) override {
    std::chrono::milliseconds reply_after{0};
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++attempts_[Call::kHeartbeat];
      if (Lost(lose_request_, Call::kHeartbeat)) return absl::UnavailableError("lost on the way");
      if (!known_.count(request.worker_id())) return absl::NotFoundError("unknown worker session");
      heartbeats.push_back(request);
      heartbeat_arrivals.push_back(std::chrono::steady_clock::now());
      changed_.notify_all();
      reply_after = heartbeat_reply_after_;
    }
    std::this_thread::sleep_for(reply_after);
    return absl::OkStatus();
  }
  // Heartbeats are answered `delay` after they arrive (a slow coordinator).
  void AnswerHeartbeatsAfter(std::chrono::milliseconds delay) {
    std::lock_guard<std::mutex> lock(mu_);
    heartbeat_reply_after_ = delay;
  }
  absl::StatusOr<v1::ReportResponse> ReportSteps(const v1::StepReports& reports) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++attempts_[Call::kReportSteps];
    if (Lost(lose_request_, Call::kReportSteps)) return absl::UnavailableError("lost");
    for (const v1::StepReport& r : reports.reports()) steps.push_back(r.step());
    changed_.notify_all();
    if (Lost(lose_reply_, Call::kReportSteps)) return absl::DeadlineExceededError("reply lost");
    return v1::ReportResponse();
  }
  absl::Status ReportStageEnd(const v1::StageEnd& end, absl::Duration) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++attempts_[Call::kStageEnd];
    if (Lost(lose_request_, Call::kStageEnd)) return absl::UnavailableError("lost");
    ends.push_back(end);
    order.push_back("end");
    changed_.notify_all();
    return absl::OkStatus();
  }
  absl::StatusOr<v1::DrainWorkerResponse> Drain(const v1::DrainWorkerRequest&) override {
    std::lock_guard<std::mutex> lock(mu_);
    order.push_back("drain");
    changed_.notify_all();
    v1::DrainWorkerResponse response;  // 0: nothing to wait for, stop at once
    response.set_checkpoint_step(drain_checkpoint_);
    return response;
  }
  // Drains answer that a checkpoint is scheduled before `step`: the worker then waits for
  // its stage to be stopped (or to end).
  void AnswerDrainsWith(int64_t step) {
    std::lock_guard<std::mutex> lock(mu_);
    drain_checkpoint_ = step;
  }
  absl::Status Deregister(const v1::DeregisterWorkerRequest& request) override {
    std::lock_guard<std::mutex> lock(mu_);
    order.push_back("deregister " + request.worker_id());
    changed_.notify_all();
    return absl::OkStatus();
  }
  // Its jobs keep no survivors (no commit): a stopped rank is told so.
  absl::StatusOr<v1::SurvivorInstruction> ReportStopped(const v1::StoppedRank&,
                                                        absl::Duration) override {
    v1::SurvivorInstruction abandon;
    abandon.set_action(v1::SurvivorInstruction::ABANDON);
    abandon.set_reason("the job commits no steps");
    return abandon;
  }
  std::shared_ptr<rendezvous::KeyValueStore> JobStore(const std::string& job_id,
                                                      int /*generation*/) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto& store = stores_[job_id];
    if (!store) store = rendezvous::MakeMemoryStore();
    return store;
  }

  int attempts(Call call) {
    std::lock_guard<std::mutex> lock(mu_);
    return attempts_[call];
  }

  // What arrived (read under WaitFor, or once the worker is stopped).
  std::vector<v1::RegisterWorkerRequest> registrations;
  std::vector<v1::HeartbeatRequest> heartbeats;
  std::vector<std::chrono::steady_clock::time_point> heartbeat_arrivals;  // one per heartbeat
  std::vector<int64_t> steps;  // every step report as it came, resent ones again
  std::vector<v1::StageEnd> ends;
  std::vector<std::string> order;  // drain, end, deregister as they came

 private:
  static bool Lost(std::map<Call, int>& counts, Call call) {
    int& left = counts[call];
    if (left <= 0) return false;
    --left;
    return true;
  }

  std::mutex mu_;
  std::condition_variable changed_;
  std::map<Call, int> lose_request_, lose_reply_, attempts_;
  absl::Status refuse_;
  bool hold_ = false;
  int64_t drain_checkpoint_ = 0;
  std::chrono::milliseconds heartbeat_reply_after_{0};
  std::set<std::string> known_;
  std::map<std::string, std::shared_ptr<rendezvous::KeyValueStore>> stores_;
};

WorkerOptions Options() {
  WorkerOptions o;
  o.coordinator = "fake";
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "";
  return o;
}

// One stage, one replica: the whole job on this worker.
v1::StageAssignment OneStageJob(int steps) {
  absl::StatusOr<v1::JobSpec> spec = jobspec::JobSpecFromYaml(absl::StrCat(
      "model: {name: gpt, d_model: 16, n_heads: 2, n_layers: 1}\n"
      "data: {kind: synthetic, seq_len: 8, vocab: 16, num_tokens: 2048}\n"
      "schedule: gpipe\nstages: 1\nmicrobatches: 2\nthreads_per_stage: 1\ntimeout_s: 30\n"
      "steps: ",
      steps, "\n"));
  EXPECT_TRUE(spec.ok()) << spec.status();
  v1::StageAssignment a;
  a.set_job_id("job-0001");
  *a.mutable_spec() = *spec;
  a.set_rank(0);
  a.set_generation(1);
  return a;
}

// Calls the worker at `address` as the coordinator does: with its command key, 20 s at most.
template <typename Call>
grpc::Status AsCoordinator(const std::string& address, const std::string& key, Call call) {
  auto stub =
      v1::WorkerService::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  rpc::AddCommandKey(ctx, key);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  v1::AssignResponse response;
  return call(*stub, &ctx, &response);
}

grpc::Status Assign(const std::string& address, const std::string& key,
                    const v1::StageAssignment& assignment) {
  return AsCoordinator(address, key, [&](auto& stub, auto* ctx, auto* response) {
    return stub.AssignStage(ctx, assignment, response);
  });
}

grpc::Status StopStage(const std::string& address, const std::string& key,
                       const std::string& job_id, const std::string& reason) {
  v1::StopStageRequest request;
  request.set_job_id(job_id);
  request.set_reason(reason);
  return AsCoordinator(address, key, [&](auto& stub, auto* ctx, auto* response) {
    return stub.StopStage(ctx, request, response);
  });
}

TEST(WorkerCore, RegistrationIsRetriedUntilAnsweredAndARefusedTokenIsNot) {
  auto fake = std::make_shared<FakeCoordinator>();
  fake->LoseRequests(Call::kRegister, 3);
  auto worker = Worker::Start(Options(), absl::Seconds(10), fake);
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ((*worker)->id(), "worker-1");
  EXPECT_EQ(fake->attempts(Call::kRegister), 4);
  EXPECT_EQ(fake->registrations[0].address(), (*worker)->address());
  EXPECT_EQ(fake->registrations[0].command_key().size(), 32u);

  auto refusing = std::make_shared<FakeCoordinator>();
  refusing->RefuseRegistrations(absl::UnauthenticatedError("bad token"));
  auto refused = Worker::Start(Options(), absl::Seconds(10), refusing);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("--token-file"));
  EXPECT_EQ(refusing->attempts(Call::kRegister), 1);  // no retry: it cannot help
}

// A coordinator that restarted no longer knows the worker: its heartbeat is refused with
// NOT_FOUND, and it registers again and goes on heartbeating under its new id.
TEST(WorkerCore, AWorkerTheCoordinatorForgotRegistersAgain) {
  auto fake = std::make_shared<FakeCoordinator>();
  auto worker = Worker::Start(Options(), absl::Seconds(10), fake);
  ASSERT_TRUE(worker.ok()) << worker.status();
  ASSERT_TRUE(fake->WaitFor([&] { return !fake->heartbeats.empty(); }));
  fake->Forget();
  ASSERT_TRUE(fake->WaitFor([&] {
    return fake->registrations.size() == 2 && fake->heartbeats.back().worker_id() == "worker-2";
  }));
  EXPECT_EQ((*worker)->id(), "worker-2");
  EXPECT_EQ(fake->registrations[1].command_key(), fake->registrations[0].command_key());
}

// The coordinator assigns a rank as soon as it has registered the worker, which may be
// before the registration's reply arrives: the assignment waits for it, then runs. Step
// reports whose replies were lost are sent again (the coordinator skips what it counted),
// so every step arrives, in order; a stage end that got no answer is sent again.
TEST(WorkerCore, AnEarlyAssignmentRunsAndLostRepliesAreResent) {
  auto fake = std::make_shared<FakeCoordinator>();
  fake->HoldRegistrations();
  fake->LoseRequests(Call::kReportSteps, 1);
  fake->LoseReplies(Call::kReportSteps, 2);
  fake->LoseRequests(Call::kStageEnd, 2);
  std::unique_ptr<Worker> worker;
  std::thread start([&] {
    auto started = Worker::Start(Options(), absl::Seconds(20), fake);
    ASSERT_TRUE(started.ok()) << started.status();
    worker = *std::move(started);
  });
  ASSERT_TRUE(fake->WaitFor([&] { return !fake->registrations.empty(); }));
  const v1::RegisterWorkerRequest registered = fake->registrations[0];
  constexpr int kSteps = 6;
  grpc::Status assigned;
  std::thread assign([&] {
    assigned = Assign(registered.address(), registered.command_key(), OneStageJob(kSteps));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the assignment is waiting
  fake->Release();
  start.join();
  assign.join();
  ASSERT_TRUE(assigned.ok()) << assigned.error_message();
  ASSERT_TRUE(fake->WaitFor([&] { return !fake->ends.empty(); }));
  const v1::StageEnd end = fake->ends[0];
  EXPECT_TRUE(end.ok()) << end.error();
  EXPECT_EQ(end.worker_id(), "worker-1");
  EXPECT_EQ(fake->attempts(Call::kStageEnd), 3);  // two lost, the third taken
  worker->Stop();
  // Every step, in order; resent batches repeat steps, never skip or reorder one.
  std::vector<int64_t> distinct;
  for (int64_t s : fake->steps) {
    if (distinct.empty() || s > distinct.back()) {
      ASSERT_EQ(s, distinct.empty() ? 0 : distinct.back() + 1) << "a step was skipped";
      distinct.push_back(s);
    } else {
      EXPECT_LE(s, distinct.back());  // a resend of one already sent
    }
  }
  EXPECT_EQ(distinct.size(), static_cast<size_t>(kSteps));
  EXPECT_GT(fake->steps.size(), distinct.size()) << "the lost replies' reports were not resent";
}

// Stopped (SIGTERM) while its rank runs: the worker asks to drain, says why its rank ends
// before anything else can be taken for the cause, and leaves the pool.
TEST(WorkerCore, AWorkerStoppedWhileItsRankRunsSaysWhyThenLeaves) {
  auto fake = std::make_shared<FakeCoordinator>();
  auto worker = Worker::Start(Options(), absl::Seconds(10), fake);
  ASSERT_TRUE(worker.ok()) << worker.status();
  const v1::RegisterWorkerRequest registered = fake->registrations[0];
  ASSERT_TRUE(Assign(registered.address(), registered.command_key(), OneStageJob(1000000)).ok());
  ASSERT_TRUE(fake->WaitFor([&] { return !fake->steps.empty(); }));  // it runs
  (*worker)->Stop();
  ASSERT_GE(fake->ends.size(), 1u);
  EXPECT_FALSE(fake->ends[0].ok());
  EXPECT_THAT(fake->ends[0].error(), HasSubstr("the worker is shutting down"));
  ASSERT_GE(fake->order.size(), 3u);
  EXPECT_EQ(fake->order.front(), "drain");
  EXPECT_EQ(fake->order[1], "end");
  EXPECT_EQ(fake->order.back(), "deregister worker-1");
}

// A drain races its stage. The coordinator answers the drain with a checkpoint to wait for,
// and either the stage ends on its own first (its last step) or the coordinator stops it
// after the checkpoint: either way the worker's wait ends with the stage (not at the drain's
// 60 s limit), the stage's own end is the only one reported, and the worker leaves.
TEST(WorkerCore, ADrainEndsWithItsStageWhicheverEndsIt) {
  for (const bool stopped_by_coordinator : {false, true}) {
    SCOPED_TRACE(stopped_by_coordinator ? "stopped by the coordinator" : "ended on its own");
    auto fake = std::make_shared<FakeCoordinator>();
    fake->AnswerDrainsWith(3);
    auto worker = Worker::Start(Options(), absl::Seconds(10), fake);
    ASSERT_TRUE(worker.ok()) << worker.status();
    const v1::RegisterWorkerRequest registered = fake->registrations[0];
    constexpr int kSteps = 400;  // about a second: the drain comes while it runs
    ASSERT_TRUE(Assign(registered.address(), registered.command_key(),
                       OneStageJob(stopped_by_coordinator ? 1000000 : kSteps))
                    .ok());
    ASSERT_TRUE(fake->WaitFor([&] { return !fake->steps.empty(); }));  // it runs
    std::thread coordinator;
    if (stopped_by_coordinator) {
      coordinator = std::thread([&] {
        ASSERT_TRUE(fake->WaitFor([&] { return !fake->order.empty(); }));  // the drain came
        EXPECT_TRUE(StopStage(registered.address(), registered.command_key(), "job-0001",
                              "restarting without worker-1 (drained)")
                        .ok());
      });
    }
    const absl::Time start = absl::Now();
    (*worker)->Stop();
    if (coordinator.joinable()) coordinator.join();
    EXPECT_LT(absl::Now() - start, absl::Seconds(30));
    ASSERT_EQ(fake->ends.size(), 1u);
    if (stopped_by_coordinator) {
      EXPECT_FALSE(fake->ends[0].ok());
      EXPECT_EQ(fake->ends[0].error(), "stopped: restarting without worker-1 (drained)");
    } else {
      EXPECT_TRUE(fake->ends[0].ok()) << fake->ends[0].error();
      EXPECT_EQ(fake->steps.back(), kSteps - 1);
    }
    EXPECT_THAT(fake->order, ElementsAre("drain", "end", "deregister worker-1"));
  }
}

// Cut off from the coordinator (every heartbeat and step report lost from some moment on), a
// worker stops its running stage once its lease (150 ms here, three 50 ms intervals) has
// passed without an answered heartbeat, saying why, instead of running a rank the
// coordinator has given up on; the stage ends although its step reports find no taker.
TEST(WorkerCore, AWorkerCutOffFromTheCoordinatorStopsItsStageWhenItsLeaseEnds) {
  auto fake = std::make_shared<FakeCoordinator>();
  auto worker = Worker::Start(Options(), absl::Seconds(10), fake);
  ASSERT_TRUE(worker.ok()) << worker.status();
  const v1::RegisterWorkerRequest registered = fake->registrations[0];
  ASSERT_TRUE(Assign(registered.address(), registered.command_key(), OneStageJob(1000000)).ok());
  ASSERT_TRUE(fake->WaitFor([&] { return !fake->steps.empty(); }));  // it runs
  const auto cut = std::chrono::steady_clock::now();
  // Heartbeats and step reports lost from now on (the stage end gets through, for the test
  // to see it): the stage ends all the same, its last reports given one try.
  fake->LoseRequests(Call::kHeartbeat, 1 << 30);
  fake->LoseRequests(Call::kReportSteps, 1 << 30);
  ASSERT_TRUE(fake->WaitFor([&] { return !fake->ends.empty(); }));
  const double stopped_after_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - cut).count();
  EXPECT_FALSE(fake->ends[0].ok());
  EXPECT_THAT(fake->ends[0].error(), HasSubstr("no heartbeat answered by the coordinator"));
  EXPECT_THAT(fake->ends[0].error(), HasSubstr("this worker's lease is 150ms"));
  EXPECT_LT(stopped_after_s, 5.0);
  std::printf("stopped %.3f s after the heartbeats were cut (lease 0.15 s)\n", stopped_after_s);
  (*worker)->Stop();
}

// Heartbeats go at a fixed rate, an interval (50 ms here) after the last was sent, however
// slowly the coordinator answers (45 ms here): the gap the coordinator sees stays one
// interval, well inside the two after which it takes the worker for lost. (Were the next
// one due an interval after the answer, every gap would be at least 95 ms.)
TEST(WorkerCore, HeartbeatsKeepTheirRateWhenTheCoordinatorAnswersSlowly) {
  auto fake = std::make_shared<FakeCoordinator>();
  fake->AnswerHeartbeatsAfter(std::chrono::milliseconds(45));
  auto worker = Worker::Start(Options(), absl::Seconds(10), fake);
  ASSERT_TRUE(worker.ok()) << worker.status();
  ASSERT_TRUE(fake->WaitFor([&] { return fake->heartbeat_arrivals.size() >= 12; }));
  (*worker)->Stop();
  std::vector<double> gaps_ms;
  for (size_t i = 2; i < 12; ++i) {  // past the first, sent before the interval was known
    gaps_ms.push_back(std::chrono::duration<double, std::milli>(fake->heartbeat_arrivals[i] -
                                                                fake->heartbeat_arrivals[i - 1])
                          .count());
  }
  std::sort(gaps_ms.begin(), gaps_ms.end());
  const double median_ms = gaps_ms[gaps_ms.size() / 2];
  std::printf(
      "heartbeat gaps: median %.1f ms, longest %.1f ms (interval 50 ms, answers after "
      "45 ms)\n",
      median_ms, gaps_ms.back());
  EXPECT_GE(median_ms, 45.0);
  EXPECT_LT(median_ms, 80.0);
}

}  // namespace
}  // namespace pipetrain::worker
