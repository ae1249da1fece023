// What workers may say and ask: only for themselves and their ranks, step reports in order
// and within the job, a bounded rendezvous store, paging, bounded calls, a blocked state loop
// noticed; what callers are shown is already stored.
// The coordinator's rules without processes, sockets or sleeps (coordinator_fixture.h); the
// daemon tests (tests/daemons) check the same rules end to end over gRPC.
#include <atomic>
#include <map>

#include "tests/coordinator/coordinator_fixture.h"

namespace pipetrain::coordinator::core_test {
namespace {

using ::testing::HasSubstr;

// A worker speaks only for itself and its own ranks: its session names it. Another worker's
// id, another worker's rank, or a job it does not run is refused and changes nothing; an
// unknown session is told to register again.
TEST_F(CoordinatorCoreTest, AWorkerSpeaksOnlyForItselfAndItsOwnRanks) {
  const std::string w1 = Register(1), w2 = Register(2);
  const v1::Job job = Submit(Spec(2));
  RunLater();
  const std::string s1 = sessions_[w1], s2 = sessions_[w2];
  ASSERT_NE(s1, s2);
  // Reports: w1 runs rank 0, w2 rank 1.
  EXPECT_TRUE(ReportSteps(s1, {Report(w1, job.id(), 0, 0)}).ok());
  EXPECT_EQ(ReportSteps(s1, {Report(w2, job.id(), 1, 0)}).code(),
            absl::StatusCode::kPermissionDenied);  // w1 claiming to be w2
  EXPECT_EQ(ReportSteps(s1, {Report(w1, job.id(), 1, 0)}).code(),
            absl::StatusCode::kPermissionDenied);  // w1 reporting w2's rank
  EXPECT_EQ(ReportSteps("", {Report(w1, job.id(), 0, 1)}).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReportSteps("forged", {Report(w1, job.id(), 0, 1)}).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(Get(job.id()).stage_status(1).step(), -1);
  // Ending another's rank, heartbeating as another: refused.
  v1::StageEnd end;
  end.set_worker_id(w1);
  end.set_job_id(job.id());
  end.set_rank(1);
  end.set_ok(true);
  EXPECT_EQ(coordinator_->reports().ReportStageEnd(s1, end).status().code(),
            absl::StatusCode::kPermissionDenied);
  end.set_worker_id(w2);
  EXPECT_EQ(coordinator_->reports().ReportStageEnd(s1, end).status().code(),
            absl::StatusCode::kPermissionDenied);
  v1::HeartbeatRequest h;
  h.set_worker_id(w2);
  EXPECT_EQ(coordinator_->workers().Heartbeat(s1, h).code(), absl::StatusCode::kPermissionDenied);
  // A heartbeat about a rank the worker does not run does not touch that rank.
  h.set_worker_id(w1);
  h.set_job_id(job.id());
  h.set_rank(1);
  h.set_action("F9");
  EXPECT_TRUE(coordinator_->workers().Heartbeat(s1, h).ok());
  EXPECT_EQ(Get(job.id()).stage_status(1).action(), "");
  // The rendezvous: only the job's own workers, for its current generation.
  EXPECT_TRUE(coordinator_->workers().Rendezvous(s1, job.id(), 1).ok());
  for (int other : {0, 2}) {
    const absl::Status s = coordinator_->workers().Rendezvous(s1, job.id(), other).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << other;
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("generation ", other, " of job ", job.id(),
                                                    " has ended (it runs 1)")));
  }
  const std::string w3 = Register(3);
  EXPECT_EQ(coordinator_->workers().Rendezvous(sessions_[w3], job.id(), 1).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(coordinator_->workers().Rendezvous("", job.id(), 1).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(Get(job.id()).state(), v1::JOB_STATE_RUNNING);
}

// Step reports come in order, within the job's steps: anything else is refused whole (the
// job untouched, however large the step), and a report already counted (resent after a lost
// reply) is skipped.
TEST_F(CoordinatorCoreTest, StepReportsAreTheNextStepWithinTheJobOrAreRefusedWhole) {
  const std::string w1 = Register(1);
  v1::JobSpec spec = Spec(1);
  spec.set_steps(6);
  const v1::Job job = Submit(spec);
  RunLater();
  const std::string s1 = sessions_[w1];
  EXPECT_TRUE(ReportSteps(s1, {Report(w1, job.id(), 0, 0), Report(w1, job.id(), 0, 1)}).ok());
  EXPECT_EQ(Get(job.id()).step(), 1);
  // A gap, a step far beyond the job (once this wedged the coordinator), past the last step:
  // the whole batch is refused, its valid first report included.
  for (int64_t step : {int64_t{4}, int64_t{100000000000}}) {
    SCOPED_TRACE(step);
    const absl::Status s =
        ReportSteps(s1, {Report(w1, job.id(), 0, 2), Report(w1, job.id(), 0, step)});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("expected step 3 of 6"));
    EXPECT_EQ(Get(job.id()).step(), 1);
  }
  // Times that are not finite: refused.
  v1::StepReport bad_time = Report(w1, job.id(), 0, 2);
  bad_time.set_end_s(std::nan(""));
  EXPECT_EQ(ReportSteps(s1, {bad_time}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Get(job.id()).step(), 1);
  // So is a breakdown (`pipetrain metrics`) with a time that is not finite or negative, or a
  // bubble ratio over 1.
  for (double forward : {std::nan(""), -1.0, std::numeric_limits<double>::infinity()}) {
    v1::StepReport bad = Report(w1, job.id(), 0, 2);
    bad.mutable_breakdown()->set_forward_s(forward);
    EXPECT_EQ(ReportSteps(s1, {bad}).code(), absl::StatusCode::kInvalidArgument) << forward;
  }
  v1::StepReport bad_bubble = Report(w1, job.id(), 0, 2);
  bad_bubble.mutable_breakdown()->set_last_step_bubble_ratio(1.5);
  EXPECT_EQ(ReportSteps(s1, {bad_bubble}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Get(job.id()).stage_status(0).step(), 1);
  // Resent (a lost reply) and old ones are skipped without error.
  EXPECT_TRUE(ReportSteps(s1, {Report(w1, job.id(), 0, 1), Report(w1, job.id(), 0, 2)}).ok());
  EXPECT_TRUE(ReportSteps(s1, {Report(w1, job.id(), 0, -5), Report(w1, job.id(), 0, 2)}).ok());
  EXPECT_EQ(Get(job.id()).step(), 2);
  EXPECT_TRUE(ReportSteps(s1, {Report(w1, job.id(), 0, 3), Report(w1, job.id(), 0, 4),
                               Report(w1, job.id(), 0, 5)})
                  .ok());
  EXPECT_EQ(Get(job.id()).step(), 5);
  EXPECT_EQ(ReportSteps(s1, {Report(w1, job.id(), 0, 6)}).code(),
            absl::StatusCode::kInvalidArgument);  // 6 steps: 0..5
  EXPECT_EQ(Get(job.id()).step(), 5);
}

// The rendezvous store of a job holds at most 1 MiB per value and 64 MiB in all; adding to
// a counter past int64 is refused.
TEST_F(CoordinatorCoreTest, TheRendezvousStoreIsBounded) {
  const std::string w1 = Register(1);
  const v1::Job job = Submit(Spec(1));
  RunLater();
  auto store = coordinator_->workers().Rendezvous(sessions_[w1], job.id(), 1);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->Set("big", std::string(WorkerManager::kKvValueBytes + 1, 'x')).code(),
            absl::StatusCode::kResourceExhausted);
  const std::string mib(WorkerManager::kKvValueBytes, 'x');
  int stored = 0;
  absl::Status s;
  while ((s = (*store)->Set("k" + std::to_string(stored), mib)).ok()) ++stored;
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(stored, 63);  // 64 MiB in all, keys included
  EXPECT_TRUE((*store)->Delete("k0").ok());
  EXPECT_TRUE((*store)->Set("k0", mib).ok());  // room again
  EXPECT_TRUE((*store)->Add("n", INT64_MAX).ok());
  EXPECT_EQ((*store)->Add("n", 1).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(*(*store)->Add("n", 0), INT64_MAX);
}

// Listing is paged, so no answer nears the message limit whatever is stored; a page token
// that this coordinator did not give is refused.
TEST_F(CoordinatorCoreTest, JobsAreListedAPageAtATime) {
  for (int i = 0; i < 230; ++i) Submit(Spec(1));
  std::vector<std::string> ids;
  std::string token;
  int pages = 0;
  do {
    absl::StatusOr<v1::ListJobsResponse> page = coordinator_->jobs().List(100, token);
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_LE(page->jobs_size(), 100);
    for (const v1::Job& j : page->jobs()) ids.push_back(j.id());
    token = page->next_page_token();
    ++pages;
  } while (!token.empty());
  EXPECT_EQ(pages, 3);
  ASSERT_EQ(ids.size(), 230u);
  EXPECT_EQ(ids.front(), "job-0001");
  EXPECT_EQ(ids.back(), "job-0230");
  EXPECT_TRUE(std::is_sorted(ids.begin(), ids.end()));
  EXPECT_EQ(coordinator_->jobs().List(100000)->jobs_size(), 230);  // capped at 500 a page
  EXPECT_EQ(coordinator_->jobs().List(0, "not-a-token").status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Oversized fields of worker calls are refused or cut, never stored whole.
TEST_F(CoordinatorCoreTest, WorkerCallsAreBoundedBySize) {
  v1::RegisterWorkerRequest r;
  for (const std::string& address :
       {std::string(300, 'a'), std::string("no-port"), std::string("host:0"),
        std::string("host:70000"), std::string("\x1b[31m:80"), std::string("dns:///x:80")}) {
    r.set_address(address);
    EXPECT_EQ(RegisterAsNewProcess(r).status().code(), absl::StatusCode::kInvalidArgument)
        << address;
  }
  const std::string w1 = Register(1);
  const v1::Job job = Submit(Spec(1));
  RunLater();
  v1::HeartbeatRequest h;
  h.set_worker_id(w1);
  h.set_action(std::string(1000, 'F'));
  EXPECT_EQ(coordinator_->workers().Heartbeat(sessions_[w1], h).code(),
            absl::StatusCode::kInvalidArgument);
  EndRank(w1, job.id(), 0, false, std::string(1 << 20, 'e'));
  const v1::Job failed = Get(job.id());
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_LT(failed.message().size(), 4200u);
  r.set_address("[::1]:7000");
  EXPECT_TRUE(RegisterAsNewProcess(r).ok());
}

// A state loop blocked (here by a store write that hangs) is noticed: once no pass of the
// monitor completed for stall_limit, StateLoopLive() is false (health then says
// NOT_SERVING); it is true again once the loop runs.
TEST_F(CoordinatorCoreTest, ABlockedStateLoopIsNoticed) {
  CoordinatorOptions options;
  options.heartbeat_interval = absl::Milliseconds(40);  // the monitor passes every 10 ms
  options.stall_limit = absl::Seconds(5);
  auto c = Open(options, /*start_monitor=*/true);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE((*c)->StateLoopLive());
  {
    std::lock_guard<std::mutex> lock(data_->mu);
    data_->hang_puts = true;
  }
  // A submission whose write hangs holds the store; the monitor's own writes wait for it.
  std::thread submit([&] { (void)(*c)->jobs().Submit(Spec(1)); });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  auto hanging = [&] {
    std::lock_guard<std::mutex> lock(data_->mu);
    return data_->hanging > 0;
  };
  while (!hanging() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  // A pass under way may still complete once (stamping the moved clock); the one after it
  // cannot, so the clock moves until the loop is seen blocked.
  while ((*c)->StateLoopLive() && std::chrono::steady_clock::now() < deadline) {
    clock_->Advance(absl::Seconds(6));
    for (int i = 0; i < 1000; ++i) std::this_thread::yield();
  }
  EXPECT_FALSE((*c)->StateLoopLive());
  {
    std::lock_guard<std::mutex> lock(data_->mu);
    data_->hang_puts = false;
  }
  data_->released.notify_all();
  submit.join();
  while (!(*c)->StateLoopLive() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  EXPECT_TRUE((*c)->StateLoopLive());
}

// A registration whose address nobody else can reach is refused, naming the worker's flags:
// a wildcard from anywhere, a loopback address from another host. A loopback address from
// this host, or a host's own address, is taken.
TEST_F(CoordinatorCoreTest, AnAddressNobodyElseCanReachIsRefused) {
  auto request = [](const std::string& address) {
    v1::RegisterWorkerRequest r;
    r.set_address(address);
    r.set_command_key(rpc::RandomKey());
    return r;
  };
  for (const char* wildcard : {"0.0.0.0:7000", "[::]:7000"}) {
    absl::StatusOr<v1::RegisterWorkerResponse> refused =
        coordinator_->workers().Register(request(wildcard), "ipv4:10.0.0.2:5555");
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << wildcard;
    EXPECT_THAT(refused.status().message(), HasSubstr("--advertise-address ADDR or --iface"));
  }
  absl::StatusOr<v1::RegisterWorkerResponse> remote =
      coordinator_->workers().Register(request("127.0.0.1:7000"), "ipv4:10.0.0.2:5555");
  EXPECT_EQ(remote.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(remote.status().message(),
              HasSubstr("is a loopback address, but the worker registered from 10.0.0.2"));
  EXPECT_EQ(coordinator_->workers()
                .Register(request("[::1]:7000"), "ipv6:[fd00::2]:5555")
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(
      coordinator_->workers().Register(request("127.0.0.1:7001"), "ipv4:127.0.0.1:5555").ok());
  EXPECT_TRUE(
      coordinator_->workers().Register(request("10.0.0.2:7000"), "ipv4:10.0.0.2:5555").ok());
  EXPECT_TRUE(
      coordinator_->workers().Register(request("127.0.0.1:7002"), "").ok());  // peer unknown
  EXPECT_EQ(coordinator_->workers().Workers().size(), 3u);
}

// A worker names the machine it runs on (--host-name; Slurm's node name by default): kept and
// listed; a name with spaces or control characters, or over 255 bytes, is refused.
TEST_F(CoordinatorCoreTest, AWorkersHostIsKeptAndListedAndABadOneRefused) {
  auto request = [](const std::string& address, const std::string& host) {
    v1::RegisterWorkerRequest r;
    r.set_address(address);
    r.set_command_key(rpc::RandomKey());
    r.set_host(host);
    return r;
  };
  ASSERT_TRUE(coordinator_->workers().Register(request("10.0.0.2:7000", "node-3"), "").ok());
  ASSERT_TRUE(coordinator_->workers().Register(request("10.0.0.2:7001", "node-3"), "").ok());
  ASSERT_TRUE(coordinator_->workers().Register(request("10.0.0.3:7000", ""), "").ok());
  std::map<std::string, std::string> host_of;
  for (const v1::WorkerInfo& w : coordinator_->workers().Workers()) host_of[w.address()] = w.host();
  EXPECT_EQ(host_of["10.0.0.2:7000"], "node-3");
  EXPECT_EQ(host_of["10.0.0.2:7001"], "node-3");
  EXPECT_EQ(host_of["10.0.0.3:7000"], "");
  for (const std::string& bad :
       {std::string("node 3"), std::string("node\x1b[2J"), std::string(256, 'n')}) {
    const absl::Status refused =
        coordinator_->workers().Register(request("10.0.0.4:7000", bad), "").status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(refused.message(), HasSubstr("--host-name"));
  }
  EXPECT_EQ(coordinator_->workers().Workers().size(), 3u);
}

// A state a caller is shown is in the store before the answer leaves: while the write of a
// cancel hangs, Get waits for it rather than show CANCELLED (a coordinator killed then would
// come back with the job running); once the write is done, Get shows the stored state.
TEST_F(CoordinatorCoreTest, AStateACallerSeesIsAlreadyInTheStore) {
  Register(1);
  const v1::Job job = Submit(Spec(1));
  RunLater();
  ASSERT_EQ(coordinator_->jobs().Get(job.id())->state(), v1::JOB_STATE_RUNNING);
  {
    std::lock_guard<std::mutex> lock(data_->mu);
    data_->hang_puts = true;
  }
  std::thread cancel([&] { EXPECT_TRUE(coordinator_->jobs().Cancel(job.id()).ok()); });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  auto hanging = [&] {
    std::lock_guard<std::mutex> lock(data_->mu);
    return data_->hanging > 0;
  };
  while (!hanging() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  ASSERT_TRUE(hanging());  // the cancel's record is being written
  std::atomic<bool> answered{false};
  v1::JobState shown = v1::JOB_STATE_UNSPECIFIED;
  std::thread get([&] {
    shown = coordinator_->jobs().Get(job.id())->state();
    answered = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(answered.load()) << "Get showed a state whose write had not landed";
  {
    std::lock_guard<std::mutex> lock(data_->mu);
    data_->hang_puts = false;
  }
  data_->released.notify_all();
  cancel.join();
  get.join();
  EXPECT_EQ(shown, v1::JOB_STATE_CANCELLED);
  v1::Job stored;
  ASSERT_TRUE(stored.ParseFromString(data_->jobs.at(job.id()).job));
  EXPECT_EQ(stored.state(), v1::JOB_STATE_CANCELLED);
}

}  // namespace
}  // namespace pipetrain::coordinator::core_test
