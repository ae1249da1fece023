// The coordinator's rules without processes, sockets or sleeps: a clock the test moves, fake
// workers that record every call and fail on demand, an in-memory job store that can fail a
// write, and calls to workers queued until the test runs them. The daemon tests
// (tests/daemons) check the same rules end to end over gRPC.
#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <memory>
#include <limits>
#include <string>
#include <vector>

#include "coordinator/coordinator.h"
#include "coordinator/placement.h"
#include "jobspec/job_config_from_spec.h"
#include "rpc/security.h"
#include "runtime/planner/profile_json.h"
#include "tests/coordinator/coordinator_fakes.h"

namespace pipetrain::coordinator {
namespace {

using testing_fakes::FakeClock;
using testing_fakes::FakeStore;
using testing_fakes::FakeWorker;
using testing_fakes::KeyedClient;

using ::testing::HasSubstr;

// A coordinator with fakes all round; heartbeat interval 1 s.
class CoordinatorCoreTest : public ::testing::Test {
 protected:
  void SetUp() override { Open(); }

  void Open() {
    CoordinatorOptions options;
    options.heartbeat_interval = absl::Seconds(1);
    auto c = Open(options, /*start_monitor=*/false);
    ASSERT_TRUE(c.ok()) << c.status();
    coordinator_ = *std::move(c);
  }

  // A coordinator on the fakes of this fixture.
  absl::StatusOr<std::unique_ptr<Coordinator>> Open(const CoordinatorOptions& options,
                                                    bool start_monitor) {
    CoordinatorDeps deps;
    deps.store = std::make_unique<FakeStore>(data_);
    deps.clock = clock_;
    deps.connect = [this](const std::string& address, const std::string& key)
        -> absl::StatusOr<std::shared_ptr<WorkerClient>> {
      auto& w = workers_[address];
      if (!w) w = std::make_shared<FakeWorker>();
      return std::shared_ptr<WorkerClient>(std::make_shared<KeyedClient>(w, key));
    };
    deps.run_later = [this](std::function<void()> call) { later_.push_back(std::move(call)); };
    deps.start_monitor = start_monitor;
    return Coordinator::Open(options, std::move(deps));
  }

  // Runs the queued calls to workers (and any they queue), as the threads would.
  void RunLater() {
    while (!later_.empty()) {
      std::vector<std::function<void()>> calls;
      calls.swap(later_);
      for (auto& call : calls) call();
    }
  }

  // Registers `r` as a worker process newly serving at its address would: with a command
  // key of its own, which the fake at that address then holds (so the worker that was there
  // before no longer answers with its key).
  absl::StatusOr<v1::RegisterWorkerResponse> RegisterAsNewProcess(v1::RegisterWorkerRequest r) {
    r.set_command_key(rpc::RandomKey());
    auto& w = workers_[r.address()];
    if (!w) w = std::make_shared<FakeWorker>();
    w->process_key = r.command_key();
    return coordinator_->Register(r);
  }

  // Registers a worker at "host-N:7000"; returns its id (its session in sessions_).
  std::string Register(int n) {
    v1::RegisterWorkerRequest r;
    r.set_address("host-" + std::to_string(n) + ":7000");
    auto response = RegisterAsNewProcess(r);
    EXPECT_TRUE(response.ok()) << response.status();
    if (!response.ok()) return "";
    EXPECT_EQ(response->session().size(), 32u);
    sessions_[response->worker_id()] = response->session();
    return response->worker_id();
  }

  FakeWorker& Worker(int n) { return *workers_.at("host-" + std::to_string(n) + ":7000"); }

  static v1::JobSpec Spec(int stages, int replicas = 1) {
    return testing_fakes::ValidSpec(stages, replicas);
  }

  v1::Job Submit(const v1::JobSpec& spec, const std::string& profile = "") {
    auto job = coordinator_->Submit(spec, profile);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : v1::Job();
  }

  v1::Job Get(const std::string& id) { return *coordinator_->Get(id); }

  void Heartbeat(const std::string& worker, const std::string& job = "", int rank = -1) {
    v1::HeartbeatRequest h;
    h.set_worker_id(worker);
    h.set_job_id(job);
    h.set_rank(rank);
    EXPECT_TRUE(coordinator_->Heartbeat(sessions_[worker], h).ok());
  }

  void EndRank(const std::string& worker, const std::string& job, int rank, bool ok = true,
               const std::string& error = "", int generation = 0) {
    v1::StageEnd end;
    end.set_worker_id(worker);
    end.set_job_id(job);
    end.set_rank(rank);
    end.set_generation(generation);
    end.set_ok(ok);
    end.set_error(error);
    EXPECT_TRUE(coordinator_->ReportStageEnd(sessions_[worker], end).ok());
  }

  // A step report of `worker` for `rank` of `job` (times 1 s per step).
  static v1::StepReport Report(const std::string& worker, const std::string& job, int rank,
                               int64_t step) {
    v1::StepReport r;
    r.set_worker_id(worker);
    r.set_job_id(job);
    r.set_rank(rank);
    r.set_step(step);
    r.set_compute_s(step + 1.0);
    r.set_end_s(step + 1.0);
    return r;
  }
  absl::Status ReportSteps(const std::string& session, std::vector<v1::StepReport> reports) {
    v1::StepReports batch;
    for (v1::StepReport& r : reports) *batch.add_reports() = std::move(r);
    return coordinator_->ReportSteps(session, batch).status();
  }

  std::vector<std::string> EventTexts(const std::string& job) {
    std::vector<std::string> texts;
    absl::StatusOr<std::vector<v1::JobEvent>> events = coordinator_->Events(job, 0);
    EXPECT_TRUE(events.ok()) << events.status();
    if (!events.ok()) return texts;
    for (const v1::JobEvent& e : *events) texts.push_back(e.text());
    return texts;
  }

  std::shared_ptr<FakeStore::Data> data_ = std::make_shared<FakeStore::Data>();
  std::shared_ptr<FakeClock> clock_ = std::make_shared<FakeClock>();
  std::map<std::string, std::shared_ptr<FakeWorker>> workers_;
  std::map<std::string, std::string> sessions_;  // worker id -> session
  std::vector<std::function<void()>> later_;
  std::unique_ptr<Coordinator> coordinator_;
};

// `stages: auto`: planned at submission with the model's profile for the workers registered
// then; the job keeps the planned layout in its spec (same global batch) and the plan; no
// profile, no worker, a profile of another model or too little memory are clear errors that
// keep nothing.
TEST_F(CoordinatorCoreTest, StagesAutoIsPlannedForTheWorkersThereAre) {
  v1::JobSpec spec = Spec(2);
  spec.clear_stages();
  spec.set_auto_stages(true);
  const auto refused = [&](const std::string& profile, absl::StatusCode code,
                           const std::string& needle) {
    absl::StatusOr<v1::Job> job = coordinator_->Submit(spec, profile);
    ASSERT_FALSE(job.ok());
    EXPECT_EQ(job.status().code(), code) << job.status();
    EXPECT_THAT(std::string(job.status().message()), HasSubstr(needle));
    EXPECT_EQ(coordinator_->List()->jobs_size(), 0);
  };
  // The spec's GPT has 2 blocks: 5 layers.
  const auto profile = [](int layers) {
    planner::ModelProfile p;
    p.p2p = {1e-5, 1e9};
    p.allreduce = {1e-5, 1e9};
    for (int b : {1, 2, 4}) {
      planner::MicroBatchProfile size;
      size.micro_batch_size = b;
      for (int l = 0; l < layers; ++l) {
        size.layers.push_back({"layer", 0.01 * b, 0.02 * b, 0.001, 1000 * b, 1 << 20, 2 << 20,
                               4000 * b, 100});
      }
      p.sizes.push_back(size);
    }
    return planner::ModelProfileToJson(p);
  };
  refused("", absl::StatusCode::kInvalidArgument, "needs the model's profile");
  refused("{", absl::StatusCode::kInvalidArgument, "model_profile_json: ");
  refused(profile(5), absl::StatusCode::kFailedPrecondition, "no workers to plan for");
  Register(1);
  Register(2);
  refused(profile(3), absl::StatusCode::kInvalidArgument,
          "profiles 3 layers; the job's model has 5");

  const v1::Job job = Submit(spec, profile(5));
  ASSERT_TRUE(job.has_plan());
  EXPECT_EQ(job.plan().planner(), "2bw");
  EXPECT_EQ(job.plan().workers(), 2);
  EXPECT_FALSE(job.spec().auto_stages());
  EXPECT_LE(job.stages() * job.replicas(), 2);
  EXPECT_EQ(job.spec().stage_ranges_size(), job.stages());
  EXPECT_EQ(job.spec().stage_ranges(0).begin(), 0);
  EXPECT_EQ(job.spec().stage_ranges(job.stages() - 1).end(), 5);
  EXPECT_EQ(job.replicas() * job.spec().microbatches() * job.spec().microbatch_size(), 4);
  EXPECT_EQ(job.plan().predicted_peak_memory_bytes_size(), job.stages());
  EXPECT_GT(job.plan().predicted_step_time_s(), 0);
  EXPECT_FALSE(job.plan().layout().empty());
  // What the workers are given is a job like any other: it validates as it stands.
  EXPECT_TRUE(jobspec::JobConfigFromSpec(job.spec()).ok());

  // A worker with 1 MiB: nothing fits in it.
  v1::RegisterWorkerRequest small;
  small.set_address("host-9:7000");
  small.set_memory_bytes(1 << 20);
  ASSERT_TRUE(RegisterAsNewProcess(small).ok());
  absl::StatusOr<v1::Job> tight = coordinator_->Submit(spec, profile(5));
  ASSERT_FALSE(tight.ok());
  EXPECT_EQ(tight.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(tight.status().message()), HasSubstr("does not fit: needs "));
  EXPECT_THAT(std::string(tight.status().message()), HasSubstr(", have 943718 (90% of 1048576)"));
}

// Planning at submission is bounded: a profile at the limits (256 layers, 8 micro-batch sizes)
// for 16 workers with Hippie's recomputation search is planned in seconds, and one past them
// is refused.
// A spec planned at the coordinator's limits (Hippie, 256 layers, B = 128) and its profile
// at `sizes` micro-batch sizes.
v1::JobSpec SpecAtThePlanningLimits() {
  v1::JobSpec spec = testing_fakes::ValidSpec(2);
  spec.clear_stages();
  spec.set_auto_stages(true);
  spec.set_planner("hippie");
  spec.mutable_model()->set_n_layers(253);  // 256 layers
  spec.set_microbatches(16);
  spec.set_microbatch_size(8);  // B = 128
  return spec;
}
std::string ProfileAtThePlanningLimits(int sizes) {
  planner::ModelProfile p;
  p.p2p = {1e-5, 1e9};
  p.allreduce = {1e-5, 1e9};
  for (int i = 0; i < sizes; ++i) {
    const int b = 1 << i;
    planner::MicroBatchProfile size;
    size.micro_batch_size = b;
    for (int l = 0; l < 256; ++l) {
      size.layers.push_back({"layer", 0.001 * b * (1 + l % 3), 0.002 * b, 0.0001, 1000 * b,
                             1 << 16, 2 << 16, 4000 * b * (1 + l % 5), 100});
    }
    p.sizes.push_back(size);
  }
  return planner::ModelProfileToJson(p);
}

TEST_F(CoordinatorCoreTest, PlanningAtTheLimitsIsBounded) {
  const v1::JobSpec spec = SpecAtThePlanningLimits();
  for (int n = 1; n <= 20; ++n) Register(n);
  const auto start = std::chrono::steady_clock::now();
  const v1::Job job = Submit(spec, ProfileAtThePlanningLimits(8));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(job.has_plan());
  EXPECT_EQ(job.plan().workers(), 16);
  EXPECT_LT(seconds, 20.0);
  std::printf("planned 256 layers x 8 sizes for 16 workers in %.2f s (%d layouts)\n", seconds,
              job.plan().layouts_considered());
  absl::StatusOr<v1::Job> refused = coordinator_->Submit(spec, ProfileAtThePlanningLimits(9));
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("plans at most 256 layers at 8 sizes"));
}

// Planning at submission is bounded: one plan at a time (at most two more wait; the rest are
// refused at once), each within its CPU budget, and the coordinator answers meanwhile (eight
// plans at once once took 78 s each and slowed a running job twelvefold).
TEST_F(CoordinatorCoreTest, PlanningIsOneAtATimeWithinItsBudgetAndTheCoordinatorAnswers) {
  for (int n = 1; n <= 20; ++n) Register(n);
  const v1::JobSpec spec = SpecAtThePlanningLimits();
  const std::string profile = ProfileAtThePlanningLimits(4);
  std::vector<absl::Status> results(6);
  std::vector<std::thread> submitters;
  for (size_t i = 0; i < results.size(); ++i) {
    submitters.emplace_back([&, i] { results[i] = coordinator_->Submit(spec, profile).status(); });
  }
  double slowest_list_ms = 0;
  for (int i = 0; i < 20; ++i) {
    const auto start = std::chrono::steady_clock::now();
    (void)coordinator_->List(10);
    slowest_list_ms = std::max(
        slowest_list_ms, std::chrono::duration<double, std::milli>(
                             std::chrono::steady_clock::now() - start).count());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (auto& t : submitters) t.join();
  int planned = 0, refused_at_once = 0, no_turn = 0;
  for (const absl::Status& s : results) {
    if (s.ok()) ++planned;
    if (absl::IsResourceExhausted(s)) {
      const std::string message(s.message());
      if (message.find("planning other jobs (one at a time, 2 waiting)") != std::string::npos) {
        ++refused_at_once;
      } else {
        EXPECT_THAT(message, HasSubstr("no turn to plan within 30s"));  // a very busy machine
        ++no_turn;
      }
    }
  }
  std::printf("6 plans at once: %d planned, %d refused at once, %d without a turn; slowest "
              "List %.1f ms\n", planned, refused_at_once, no_turn, slowest_list_ms);
  EXPECT_EQ(planned + refused_at_once + no_turn, 6);
  EXPECT_EQ(refused_at_once, 3);  // one running, two waiting: the rest refused at once
  EXPECT_GE(planned, 1);
  EXPECT_LT(slowest_list_ms, 500);
}

// A plan over its CPU budget stops, naming the budget, and keeps nothing.
TEST(CoordinatorPlanningBudget, APlanOverItsCpuBudgetIsRefusedNamingIt) {
  CoordinatorOptions options;
  options.planning_cpu_budget = absl::Milliseconds(20);
  CoordinatorDeps deps;
  auto data = std::make_shared<FakeStore::Data>();
  deps.store = std::make_unique<FakeStore>(data);
  deps.clock = std::make_shared<FakeClock>();
  auto worker = std::make_shared<FakeWorker>();
  deps.connect = [worker](const std::string&, const std::string& key)
      -> absl::StatusOr<std::shared_ptr<WorkerClient>> {
    return std::shared_ptr<WorkerClient>(std::make_shared<KeyedClient>(worker, key));
  };
  deps.run_later = [](std::function<void()> call) { call(); };
  deps.start_monitor = false;
  auto coordinator = Coordinator::Open(options, std::move(deps));
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  for (int n = 1; n <= 16; ++n) {
    v1::RegisterWorkerRequest r;
    r.set_address("host-" + std::to_string(n) + ":7000");
    r.set_command_key(rpc::RandomKey());
    ASSERT_TRUE((*coordinator)->Register(r).ok());
  }
  absl::StatusOr<v1::Job> over =
      (*coordinator)->Submit(SpecAtThePlanningLimits(), ProfileAtThePlanningLimits(8));
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(over.status().message()), HasSubstr("over its budget of 20ms of CPU"));
  auto listed = (*coordinator)->List(10);
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->jobs_size(), 0);
}

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
  EXPECT_EQ(coordinator_->ReportStageEnd(s1, end).status().code(),
            absl::StatusCode::kPermissionDenied);
  end.set_worker_id(w2);
  EXPECT_EQ(coordinator_->ReportStageEnd(s1, end).status().code(),
            absl::StatusCode::kPermissionDenied);
  v1::HeartbeatRequest h;
  h.set_worker_id(w2);
  EXPECT_EQ(coordinator_->Heartbeat(s1, h).code(), absl::StatusCode::kPermissionDenied);
  // A heartbeat about a rank the worker does not run does not touch that rank.
  h.set_worker_id(w1);
  h.set_job_id(job.id());
  h.set_rank(1);
  h.set_action("F9");
  EXPECT_TRUE(coordinator_->Heartbeat(s1, h).ok());
  EXPECT_EQ(Get(job.id()).stage_status(1).action(), "");
  // The rendezvous: only the job's own workers.
  EXPECT_TRUE(coordinator_->Rendezvous(s1, job.id()).ok());
  const std::string w3 = Register(3);
  EXPECT_EQ(coordinator_->Rendezvous(sessions_[w3], job.id()).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(coordinator_->Rendezvous("", job.id()).status().code(), absl::StatusCode::kNotFound);
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
  auto store = coordinator_->Rendezvous(sessions_[w1], job.id());
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->Set("big", std::string(Coordinator::kKvValueBytes + 1, 'x')).code(),
            absl::StatusCode::kResourceExhausted);
  const std::string mib(Coordinator::kKvValueBytes, 'x');
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
    absl::StatusOr<v1::ListJobsResponse> page = coordinator_->List(100, token);
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
  EXPECT_EQ(coordinator_->List(100000)->jobs_size(), 230);  // capped at 500 a page
  EXPECT_EQ(coordinator_->List(0, "not-a-token").status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Oversized fields of worker calls are refused or cut, never stored whole.
TEST_F(CoordinatorCoreTest, WorkerCallsAreBoundedBySize) {
  v1::RegisterWorkerRequest r;
  for (const std::string& address : {std::string(300, 'a'), std::string("no-port"),
                                    std::string("host:0"), std::string("host:70000"),
                                    std::string("\x1b[31m:80"), std::string("dns:///x:80")}) {
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
  EXPECT_EQ(coordinator_->Heartbeat(sessions_[w1], h).code(), absl::StatusCode::kInvalidArgument);
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
  std::thread submit([&] { (void)(*c)->Submit(Spec(1)); });
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

std::vector<std::string> WaitingIds(const PlacementPlan& plan) {
  std::vector<std::string> ids;
  for (const Waiting& w : plan.waiting) ids.push_back(w.job_id);
  return ids;
}

TEST(Placement, JobsInOrderWithBackfill) {
  const PlacementPlan plan = PlaceQueuedJobs({{"a", 2}, {"b", 3}, {"c", 1}, {"d", 1}},
                                             {{"w1"}, {"w2"}, {"w3"}, {"w4"}});
  ASSERT_EQ(plan.started.size(), 3u);
  EXPECT_EQ(plan.started[0].job_id, "a");
  EXPECT_EQ(plan.started[0].rank_workers, (std::vector<std::string>{"w1", "w2"}));
  EXPECT_EQ(plan.started[1].job_id, "c");  // b does not fit in the 2 left; c and d do
  EXPECT_EQ(plan.started[1].rank_workers, (std::vector<std::string>{"w3"}));
  EXPECT_EQ(plan.started[2].job_id, "d");
  EXPECT_EQ(WaitingIds(plan), (std::vector<std::string>{"b"}));
  EXPECT_EQ(plan.waiting[0].reason, "needs 3 workers, 2 idle (2 more taken by earlier jobs)");
  const PlacementPlan none = PlaceQueuedJobs({{"a", 1}}, {});
  EXPECT_EQ(WaitingIds(none), (std::vector<std::string>{"a"}));
  EXPECT_EQ(none.waiting[0].reason, "needs 1 worker; the pool has 0: it waits for more to register");
}

// threads_per_stage is a machine-bound field: a job runs only on workers with at least that
// many cores (or that did not say), and one the pool cannot hold says so while it waits.
TEST(Placement, ThreadsPerStageNeedWorkersWithThatManyCores) {
  const std::vector<PoolWorker> pool = {{"small1", 2}, {"big1", 16}, {"small2", 2},
                                        {"busy-big", 16, /*idle=*/false}, {"unknown", 0}};
  PlacementPlan plan = PlaceQueuedJobs({{"a", 2, 8}, {"b", 2, 0}}, pool);
  ASSERT_EQ(plan.started.size(), 2u);
  EXPECT_EQ(plan.started[0].rank_workers, (std::vector<std::string>{"big1", "unknown"}));
  EXPECT_EQ(plan.started[1].rank_workers, (std::vector<std::string>{"small1", "small2"}));
  // Three 8-core ranks: the pool has three such workers, one busy -> waits for it.
  plan = PlaceQueuedJobs({{"c", 3, 8}}, pool);
  ASSERT_EQ(WaitingIds(plan), (std::vector<std::string>{"c"}));
  EXPECT_EQ(plan.waiting[0].reason,
            "needs 3 workers with at least 8 cores (threads_per_stage), 2 idle");
  // Four: more than the pool has, whatever finishes.
  plan = PlaceQueuedJobs({{"d", 4, 8}}, pool);
  ASSERT_EQ(WaitingIds(plan), (std::vector<std::string>{"d"}));
  EXPECT_EQ(plan.waiting[0].reason,
            "needs 4 workers with at least 8 cores (threads_per_stage); the pool has 3 such "
            "(of 5): it waits for more to register");
}

// A job runs only on workers of its device kind: a cuda job on workers registered as cuda or
// cuda:N, a cpu job never on them; a cuda job with no GPU workers waits, saying so.
TEST(Placement, JobsRunOnlyOnWorkersOfTheirDevice) {
  const std::vector<PoolWorker> pool = {{"cpu1", 0, true, "cpu"},
                                        {"gpu0", 0, true, "cuda:0"},
                                        {"cpu2", 0, true, "cpu"},
                                        {"gpu1", 0, true, "cuda"}};
  PlacementPlan plan = PlaceQueuedJobs({{"g", 2, 0, "cuda"}, {"c", 2, 0, "cpu"}}, pool);
  ASSERT_EQ(plan.started.size(), 2u);
  EXPECT_EQ(plan.started[0].rank_workers, (std::vector<std::string>{"gpu0", "gpu1"}));
  EXPECT_EQ(plan.started[1].rank_workers, (std::vector<std::string>{"cpu1", "cpu2"}));
  plan = PlaceQueuedJobs({{"g", 1, 0, "cuda"}}, {{"cpu1"}, {"cpu2"}});
  ASSERT_EQ(WaitingIds(plan), (std::vector<std::string>{"g"}));
  EXPECT_EQ(plan.waiting[0].reason,
            "needs 1 worker on cuda; the pool has 0 such (of 2): it waits for more to register");
  EXPECT_EQ(DeviceKind("cuda:3"), "cuda");
  EXPECT_EQ(DeviceKind("cpu"), "cpu");
}

// What /metrics shows of the coordinator: jobs and workers by state, a running job's step,
// and each stage's compute per step over the median stage's (stage 1 computes 3 s a step,
// stage 0 1 s: ratios 0.5 and 1.5), step commands counted by outcome.
TEST_F(CoordinatorCoreTest, MetricsSnapshotCountsStatesAndFindsTheStraggler) {
  const std::string w1 = Register(1), w2 = Register(2);
  const v1::Job job = Submit(Spec(2));
  RunLater();
  for (int64_t t = 0; t < 4; ++t) {
    v1::StepReport r0 = Report(w1, job.id(), 0, t), r1 = Report(w2, job.id(), 1, t);
    r0.set_compute_s(1.0 * (t + 1));
    r1.set_compute_s(3.0 * (t + 1));
    r0.mutable_breakdown()->set_forward_s(0.5 * (t + 1));
    r0.mutable_breakdown()->set_last_step_bubble_ratio(0.25);
    ASSERT_TRUE(ReportSteps(sessions_[w1], {r0}).ok());
    ASSERT_TRUE(ReportSteps(sessions_[w2], {r1}).ok());
  }
  v1::SendCommandRequest command;
  command.set_job_id("job-9999");
  command.set_command(v1::STEP_COMMAND_FLUSH);
  EXPECT_FALSE(coordinator_->SendCommand(command).ok());
  const Coordinator::MetricsSnapshot m = coordinator_->Metrics();
  EXPECT_EQ(m.jobs_by_state.at("running"), 1);
  EXPECT_EQ(m.jobs_by_state.at("queued"), 0);
  EXPECT_EQ(m.workers_by_state.at("busy"), 2);
  EXPECT_EQ(m.workers_by_state.at("lost"), 0);
  ASSERT_EQ(m.running.size(), 1u);
  EXPECT_EQ(m.running[0].id, job.id());
  EXPECT_EQ(m.running[0].step, 3);
  ASSERT_EQ(m.running[0].straggler_ratio.size(), 2u);
  EXPECT_DOUBLE_EQ(m.running[0].straggler_ratio[0], 0.5);
  EXPECT_DOUBLE_EQ(m.running[0].straggler_ratio[1], 1.5);
  EXPECT_EQ(m.step_commands.at({"flush", "NOT_FOUND"}), 1);
  // The job record shows the same ratios per rank (`pipetrain metrics`), and each rank's
  // last breakdown as reported.
  const v1::Job now = Get(job.id());
  EXPECT_DOUBLE_EQ(now.stage_status(0).straggler_ratio(), 0.5);
  EXPECT_DOUBLE_EQ(now.stage_status(1).straggler_ratio(), 1.5);
  EXPECT_DOUBLE_EQ(now.stage_status(0).breakdown().forward_s(), 2.0);
  EXPECT_DOUBLE_EQ(now.stage_status(0).breakdown().last_step_bubble_ratio(), 0.25);
}

TEST_F(CoordinatorCoreTest, AQueuedJobSaysWhyItWaitsAndStartsOnWorkersWithEnoughCores) {
  auto register_with = [this](int n, int cores) {
    v1::RegisterWorkerRequest r;
    r.set_address("host-" + std::to_string(n) + ":7000");
    r.set_cores(cores);
    auto response = RegisterAsNewProcess(r);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? response->worker_id() : "";
  };
  register_with(1, 2);
  register_with(2, 2);
  v1::JobSpec spec = Spec(2);
  spec.set_threads_per_stage(4);
  const v1::Job job = Submit(spec);
  EXPECT_EQ(Get(job.id()).state(), v1::JOB_STATE_QUEUED);
  const std::string why = "needs 2 workers with at least 4 cores (threads_per_stage); the pool "
                          "has 0 such (of 2): it waits for more to register";
  EXPECT_EQ(Get(job.id()).message(), why);
  EXPECT_THAT(EventTexts(job.id()), ::testing::Contains("queued: " + why));
  const std::string big1 = register_with(3, 8), big2 = register_with(4, 4);
  coordinator_->Tick();
  const v1::Job running = Get(job.id());
  EXPECT_EQ(running.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(running.message(), "");
  ASSERT_EQ(running.stage_status_size(), 2);
  EXPECT_EQ(running.stage_status(0).worker_id(), big1);
  EXPECT_EQ(running.stage_status(1).worker_id(), big2);
  // A worker's cores are checked like every field it sends.
  v1::RegisterWorkerRequest r;
  r.set_address("host-9:7000");
  r.set_cores(-1);
  EXPECT_EQ(RegisterAsNewProcess(r).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CoordinatorCoreTest, AJobRunsOnOneWorkerPerRankAndSucceedsWhenEveryRankEnds) {
  const std::string w1 = Register(1), w2 = Register(2);
  const v1::Job job = Submit(Spec(2));
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  RunLater();
  ASSERT_EQ(Worker(1).assigned.size(), 1u);
  ASSERT_EQ(Worker(2).assigned.size(), 1u);
  EXPECT_EQ(Worker(1).assigned[0].rank(), 0);
  EXPECT_EQ(Worker(2).assigned[0].rank(), 1);
  EndRank(w1, job.id(), 0);
  EXPECT_EQ(Get(job.id()).state(), v1::JOB_STATE_RUNNING);
  EndRank(w2, job.id(), 1);
  EXPECT_EQ(Get(job.id()).state(), v1::JOB_STATE_SUCCEEDED);
  for (const v1::WorkerInfo& w : coordinator_->Workers()) EXPECT_EQ(w.state(), v1::WORKER_STATE_IDLE);
  // Durable: the stored record says so too.
  v1::Job stored;
  ASSERT_TRUE(stored.ParseFromString(data_->jobs.at(job.id()).job));
  EXPECT_EQ(stored.state(), v1::JOB_STATE_SUCCEEDED);
}

TEST_F(CoordinatorCoreTest, AWorkerSilentForTwoIntervalsIsLostAndFailsItsJobByName) {
  const std::string w1 = Register(1), w2 = Register(2);
  const v1::Job job = Submit(Spec(2));
  RunLater();
  clock_->Advance(absl::Milliseconds(1500));
  Heartbeat(w1, job.id(), 0);
  coordinator_->Tick();
  EXPECT_EQ(Get(job.id()).state(), v1::JOB_STATE_RUNNING);  // 1.5 s of silence: not yet
  clock_->Advance(absl::Milliseconds(600));                  // worker-2: 2.1 s
  coordinator_->Tick();
  const v1::Job failed = Get(job.id());
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.message(), HasSubstr(w2 + " (host-2:7000) running stage 1 stopped sending "
                                          "heartbeats (none for 2.1s)"));
  RunLater();
  ASSERT_EQ(Worker(1).stopped.size(), 1u);  // the survivor is told to stop
  EXPECT_TRUE(Worker(2).stopped.empty());   // the lost one is not called
  std::map<std::string, v1::WorkerState> states;
  for (const v1::WorkerInfo& w : coordinator_->Workers()) states[w.id()] = w.state();
  EXPECT_EQ(states[w2], v1::WORKER_STATE_LOST);
  // A lost worker's heartbeat is refused: it must register again.
  v1::HeartbeatRequest h;
  h.set_worker_id(w2);
  EXPECT_EQ(coordinator_->Heartbeat(sessions_[w2], h).code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorCoreTest, ARankFailureIsHeldBackUntilThePeersShowTheyAreAlive) {
  const std::string w1 = Register(1), w2 = Register(2);
  const v1::Job job = Submit(Spec(2));
  RunLater();
  EndRank(w1, job.id(), 0, /*ok=*/false, "lost stage 1");  // a survivor speaks first
  coordinator_->Tick();
  EXPECT_EQ(Get(job.id()).state(), v1::JOB_STATE_RUNNING);
  // Worker 2 then dies: its loss, not the survivor's complaint, is the job's cause.
  clock_->Advance(absl::Milliseconds(2100));
  coordinator_->Tick();
  EXPECT_THAT(Get(job.id()).message(), HasSubstr(w2 + " (host-2:7000) running stage 1"));
}

// A held-back rank failure that becomes the job's restarts it with that failure as the
// recovery's cause (it was once cleared before it was recorded: restarts with empty causes).
TEST_F(CoordinatorCoreTest, EveryRestartRecordsTheFailureThatCausedIt) {
  const std::string w1 = Register(1), w2 = Register(2);
  v1::JobSpec spec = Spec(2);
  spec.set_max_restarts(2);
  const v1::Job job = Submit(spec);
  RunLater();
  EndRank(w2, job.id(), 1, /*ok=*/false, "checkpoint layer 3 cannot be unpickled");
  clock_->Advance(absl::Milliseconds(600));
  Heartbeat(w1, job.id(), 0);  // the peer shows it is alive: the failure is the job's
  coordinator_->Tick();
  const v1::Job recovering = Get(job.id());
  ASSERT_EQ(recovering.recoveries_size(), 1);
  EXPECT_THAT(recovering.recoveries(0).cause(),
              HasSubstr("failed: checkpoint layer 3 cannot be unpickled"));
  EXPECT_THAT(recovering.message(), HasSubstr("checkpoint layer 3 cannot be unpickled"));
}

// The first failure to arrive gives way to a later one when it was a consequence of another
// rank's (failed_after_peer): the real cause is the job's message, not the peer's "connection
// closed" (once the job blamed the wrong rank).
TEST_F(CoordinatorCoreTest, TheRealCauseWinsOverAFailureThatFollowedIt) {
  const std::string w1 = Register(1), w2 = Register(2);
  const v1::Job job = Submit(Spec(2));
  RunLater();
  v1::StageEnd consequence;
  consequence.set_worker_id(w2);
  consequence.set_job_id(job.id());
  consequence.set_rank(1);
  consequence.set_error("rank 0 (stage 0) failed first: layer 1 cannot be unpickled (here: "
                        "Connection closed by peer)");
  consequence.set_failed_after_peer(true);
  ASSERT_TRUE(coordinator_->ReportStageEnd(sessions_[w2], consequence).ok());
  EndRank(w1, job.id(), 0, /*ok=*/false, "layer 1 cannot be unpickled");
  const v1::Job failed = Get(job.id());
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(failed.message(), "stage 0 on " + w1 + " failed: layer 1 cannot be unpickled");
}

// A recovering job that cannot be placed holds no worker: once its last ranks ended and its
// grace passed, a queued job starts on the idle worker it cannot use, and its status says
// why it waits (it once held the queue, silently, for up to its timeout_s).
TEST_F(CoordinatorCoreTest, ARecoveringJobThatCannotBePlacedDoesNotHoldTheQueue) {
  const std::string w1 = Register(1), w2 = Register(2);
  v1::JobSpec fixed = Spec(2);
  fixed.set_max_restarts(2);
  fixed.set_timeout_s(3600);
  fixed.clear_stages();
  auto* first = fixed.add_stage_ranges();  // two fixed stages: no smaller layout
  first->set_begin(0);
  first->set_end(2);
  auto* second = fixed.add_stage_ranges();
  second->set_begin(2);
  second->set_end(5);
  const v1::Job a = Submit(fixed);
  RunLater();
  ASSERT_EQ(Get(a.id()).state(), v1::JOB_STATE_RUNNING);
  // worker-2 goes silent: a is recovering, its rank on worker-1 is stopped and ends.
  clock_->Advance(absl::Milliseconds(1500));
  Heartbeat(w1, a.id(), 0);
  clock_->Advance(absl::Milliseconds(600));
  coordinator_->Tick();
  RunLater();
  EndRank(w1, a.id(), 0, /*ok=*/false, "stopped", Get(a.id()).generation());
  const v1::Job b = Submit(Spec(1));
  EXPECT_EQ(Get(b.id()).state(), v1::JOB_STATE_QUEUED);  // within a's grace
  for (int i = 0; i < 4; ++i) {
    clock_->Advance(absl::Milliseconds(900));
    Heartbeat(w1);
    coordinator_->Tick();
  }
  RunLater();
  EXPECT_EQ(Get(b.id()).state(), v1::JOB_STATE_RUNNING);
  const v1::Job waiting = Get(a.id());
  EXPECT_EQ(waiting.state(), v1::JOB_STATE_RUNNING);
  EXPECT_THAT(waiting.message(), HasSubstr("recovering (restart 1 of 2): " + w2));
  EXPECT_THAT(waiting.message(), HasSubstr("; waits for workers to restart on: "));
  EXPECT_THAT(waiting.message(), HasSubstr("up to timeout_s (1h)"));
}

// Two jobs never write checkpoints into one directory: a job without checkpoint.dir gets its
// own (checkpoints/<id>, in its spec); a directory a queued or running job uses is refused
// naming that job, and is free again once it ended; resume_from: latest needs a directory.
TEST_F(CoordinatorCoreTest, TwoJobsNeverShareACheckpointDirectory) {
  const std::string w1 = Register(1), w2 = Register(2);
  const v1::Job a = Submit(Spec(2));
  EXPECT_EQ(a.spec().checkpoint().dir(), "checkpoints/" + a.id());
  const v1::Job b = Submit(Spec(2));  // queued behind a, in a directory of its own
  EXPECT_EQ(b.spec().checkpoint().dir(), "checkpoints/" + b.id());
  v1::JobSpec shared = Spec(2);
  shared.mutable_checkpoint()->set_dir("/shared/ckpt");
  const v1::Job c = Submit(shared);
  EXPECT_EQ(c.spec().checkpoint().dir(), "/shared/ckpt");
  for (const char* same : {"/shared/ckpt", "/shared//ckpt/", "/shared/x/../ckpt"}) {
    v1::JobSpec again = Spec(2);
    again.mutable_checkpoint()->set_dir(same);
    absl::StatusOr<v1::Job> refused = coordinator_->Submit(again, "");
    ASSERT_FALSE(refused.ok()) << same;
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(refused.status().message()),
                HasSubstr("holds the checkpoints of " + c.id() + " (queued)"));
  }
  v1::JobSpec own_of_a = Spec(2);
  own_of_a.mutable_checkpoint()->set_dir("checkpoints/" + a.id());
  EXPECT_FALSE(coordinator_->Submit(own_of_a, "").ok());  // a runs
  v1::JobSpec latest = Spec(2);
  latest.set_resume_from("latest");
  absl::StatusOr<v1::Job> no_dir = coordinator_->Submit(latest, "");
  ASSERT_FALSE(no_dir.ok());
  EXPECT_THAT(std::string(no_dir.status().message()), HasSubstr("needs checkpoint.dir"));
  // Once c ended its directory may be resumed from (and written to) by another job.
  ASSERT_TRUE(coordinator_->Cancel(c.id()).ok());
  shared.set_resume_from("latest");
  EXPECT_TRUE(coordinator_->Submit(shared, "").ok());
}

// A busy worker's address is not taken by another registration while that worker still
// answers there with its key (a holder of the join token once failed its job that way); a
// worker restarted on the address (the old process gone) takes it over at once; a
// registration without a command key is refused.
TEST_F(CoordinatorCoreTest, AnAddressIsTakenOverOnlyFromAWorkerThatNoLongerAnswers) {
  Register(1);
  const std::string w2 = Register(2);
  const v1::Job job = Submit(Spec(2));
  RunLater();
  v1::RegisterWorkerRequest rogue;
  rogue.set_address("host-2:7000");
  rogue.set_command_key(std::string(32, 'a'));  // the process at host-2 still holds its own
  absl::StatusOr<v1::RegisterWorkerResponse> refused = coordinator_->Register(rogue);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("is held by " + w2));
  EXPECT_EQ(Get(job.id()).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Get(job.id()).restarts(), 0);
  v1::RegisterWorkerRequest keyless;
  keyless.set_address("host-7:7000");
  EXPECT_EQ(coordinator_->Register(keyless).status().code(), absl::StatusCode::kInvalidArgument);
  // The worker at host-2 restarts: the new process there answers with another key.
  v1::RegisterWorkerRequest restarted;
  restarted.set_address("host-2:7000");
  absl::StatusOr<v1::RegisterWorkerResponse> back = RegisterAsNewProcess(restarted);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_NE(back->worker_id(), w2);
  EXPECT_THAT(Get(job.id()).message(), HasSubstr("it restarted"));
}

TEST_F(CoordinatorCoreTest, QueuedJobsStartInOrderWithBackfill) {
  const std::string w1 = Register(1), w2 = Register(2), w3 = Register(3);
  const v1::Job a = Submit(Spec(2));
  const v1::Job b = Submit(Spec(2));  // 1 worker left: waits
  const v1::Job c = Submit(Spec(1));  // fits in it: starts before b
  EXPECT_EQ(Get(a.id()).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Get(b.id()).state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(Get(c.id()).state(), v1::JOB_STATE_RUNNING);
  EXPECT_THAT(EventTexts(b.id()), ::testing::Contains("queued: needs 2 workers, 1 idle"));
  RunLater();
  EndRank(w1, a.id(), 0);
  EndRank(w2, a.id(), 1);
  EXPECT_EQ(Get(a.id()).state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(Get(b.id()).state(), v1::JOB_STATE_RUNNING);  // on the two workers a freed
  RunLater();
  EXPECT_EQ(Worker(1).assigned.back().job_id(), b.id());
  EXPECT_EQ(Worker(2).assigned.back().job_id(), b.id());
}

// A worker that registered and heartbeats but cannot be reached: with no other idle worker
// the job goes back to the queue saying why (it once failed: "assigning ... Deadline
// Exceeded"), its other rank is stopped and freed, the unreachable worker is lost, and the job
// starts again, as the next generation, once a worker registers.
TEST_F(CoordinatorCoreTest, AnUnreachableWorkerRequeuesTheJobToWaitForAnother) {
  Register(1);
  const std::string w2 = Register(2);
  Worker(1).fail_assign = true;
  const v1::Job job = Submit(Spec(2));
  RunLater();
  const v1::Job requeued = Get(job.id());
  EXPECT_EQ(requeued.state(), v1::JOB_STATE_QUEUED);
  EXPECT_THAT(requeued.message(),
              HasSubstr("requeued: assigning stage 0 to worker-1 failed: connection refused"));
  EXPECT_EQ(requeued.restarts(), 0);
  ASSERT_EQ(Worker(2).stopped.size(), 1u);
  EndRank(w2, job.id(), 1, false, "stopped", requeued.generation());
  // The unreachable worker is lost (never chosen again until it registers again); the other
  // is free.
  std::map<std::string, v1::WorkerState> states;
  for (const v1::WorkerInfo& w : coordinator_->Workers()) states[w.id()] = w.state();
  EXPECT_EQ(states["worker-1"], v1::WORKER_STATE_LOST);
  EXPECT_EQ(states[w2], v1::WORKER_STATE_IDLE);
  EXPECT_EQ(Get(job.id()).state(), v1::JOB_STATE_QUEUED);
  const std::string w3 = Register(3);
  RunLater();
  const v1::Job again = Get(job.id());
  EXPECT_EQ(again.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(again.generation(), requeued.generation() + 1);
  ASSERT_EQ(Worker(3).assigned.size(), 1u);
  EXPECT_EQ(Worker(3).assigned[0].generation(), again.generation());
}

// An assignment a worker cannot take (unreachable) goes to another idle worker, a bounded
// number of times; the job runs on the workers that took it.
TEST_F(CoordinatorCoreTest, AFailedAssignmentIsRetriedOnAnotherIdleWorker) {
  Register(1);
  Register(2);
  Register(3);
  Worker(1).fail_assign = true;
  const v1::Job job = Submit(Spec(2));
  RunLater();
  const v1::Job running = Get(job.id());
  EXPECT_EQ(running.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(running.stage_status(0).worker_id(), "worker-3");
  EXPECT_EQ(running.stage_status(1).worker_id(), "worker-2");
  ASSERT_EQ(Worker(3).assigned.size(), 1u);
  EXPECT_EQ(Worker(3).assigned[0].rank(), 0);
  EXPECT_THAT(EventTexts(job.id()),
              ::testing::Contains(HasSubstr("assigning stage 0 to worker-1 failed: connection "
                                            "refused; assigned to worker-3 instead")));
  // Every worker unreachable: a rank is tried on assign_attempts (3) workers, then the job
  // waits in the queue; placed again on the idle ones left, it ends up having tried each
  // unreachable worker once (each is lost then), and waits for a worker that can be reached.
  for (int n = 4; n <= 8; ++n) Register(n);
  for (int n = 4; n <= 8; ++n) Worker(n).fail_assign = true;
  const v1::Job doomed = Submit(Spec(1));
  RunLater();
  EXPECT_EQ(Get(doomed.id()).state(), v1::JOB_STATE_QUEUED);
  EXPECT_THAT(Get(doomed.id()).message(), HasSubstr("requeued: assigning stage 0"));
  for (int n = 4; n <= 8; ++n) EXPECT_EQ(Worker(n).assigned.size(), 1u) << "worker " << n;
  for (const v1::WorkerInfo& w : coordinator_->Workers()) {
    if (w.address() >= "host-4") {
      EXPECT_EQ(w.state(), v1::WORKER_STATE_LOST) << w.id();
    }
  }
}

// A worker that stops on purpose leaves at once (the rank it ran is lost, naming why); one
// that is lost is listed as lost, then forgotten after the TTL; one registering again from
// the same address replaces its old entry.
TEST_F(CoordinatorCoreTest, WorkersLeaveWhenStoppedAreForgottenWhenLostAndReplacedWhenBack) {
  const std::string w1 = Register(1), w2 = Register(2);
  const v1::Job job = Submit(Spec(2));
  RunLater();
  v1::DeregisterWorkerRequest leave;
  leave.set_worker_id(w2);
  EXPECT_EQ(coordinator_->Deregister(sessions_[w1], leave).code(),
            absl::StatusCode::kPermissionDenied);  // not for another worker
  EXPECT_TRUE(coordinator_->Deregister(sessions_[w2], leave).ok());
  const v1::Job failed = Get(job.id());
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.message(), HasSubstr(w2 + " (host-2:7000) running stage 1 stopped (it was shut "
                                          "down)"));
  EXPECT_EQ(coordinator_->Workers().size(), 1u);

  // Lost, listed as lost, then forgotten (TTL 1 minute).
  clock_->Advance(absl::Seconds(3));
  coordinator_->Tick();
  ASSERT_EQ(coordinator_->Workers().size(), 1u);
  EXPECT_EQ(coordinator_->Workers()[0].state(), v1::WORKER_STATE_LOST);
  clock_->Advance(absl::Seconds(61));
  coordinator_->Tick();
  EXPECT_TRUE(coordinator_->Workers().empty());

  // Registering twice from one address: one entry, the newest.
  const std::string first = Register(5), second = Register(5);
  ASSERT_NE(first, second);
  const std::vector<v1::WorkerInfo> workers = coordinator_->Workers();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0].id(), second);
  v1::HeartbeatRequest h;
  h.set_worker_id(first);
  EXPECT_EQ(coordinator_->Heartbeat(sessions_[first], h).code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorCoreTest, StepCommandsGoToTheWorkerOfRankZero) {
  Register(1);
  Register(2);
  const v1::Job job = Submit(Spec(2));
  RunLater();
  v1::SendCommandRequest r;
  r.set_job_id(job.id());
  r.set_command(v1::STEP_COMMAND_FLUSH);
  r.set_step(3);
  auto response = coordinator_->SendCommand(r);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->step(), 3);
  EXPECT_EQ(Worker(1).commands.size(), 1u);
  EXPECT_TRUE(Worker(2).commands.empty());
  EXPECT_THAT(EventTexts(job.id()), ::testing::Contains("flush scheduled before step 3"));
  // Refused for a job that does not run, and for an unknown one.
  r.set_job_id("job-0099");
  EXPECT_EQ(coordinator_->SendCommand(r).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorCoreTest, ARestartFailsTheRunningJobsAndKeepsTheRest) {
  const std::string w1 = Register(1);
  const v1::Job done = Submit(Spec(1));
  RunLater();
  EndRank(w1, done.id(), 0);
  const v1::Job running = Submit(Spec(1));
  RunLater();
  coordinator_.reset();  // the coordinator goes; its store stays
  Open();
  EXPECT_EQ(Get(done.id()).state(), v1::JOB_STATE_SUCCEEDED);
  const v1::Job interrupted = Get(running.id());
  EXPECT_EQ(interrupted.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(interrupted.message(), HasSubstr("interrupted by a coordinator restart"));
  EXPECT_THAT(EventTexts(running.id()).back(), HasSubstr("interrupted by a coordinator restart"));
  // Ids are never handed out twice: the next worker and job get new ones.
  EXPECT_EQ(Register(2), "worker-2");
  EXPECT_EQ(Submit(Spec(1)).id(), "job-0003");
}

// Recovery (coordinator.h): a fault ends generation 1; once its survivors have ended, the
// job runs generation 2 from the newest checkpoint committed with every step before it;
// the earlier generation's reports change nothing; each step is committed once.
TEST_F(CoordinatorCoreTest, AFaultRestartsTheJobFromItsCheckpointAsTheNextGeneration) {
  const std::string w1 = Register(1), w2 = Register(2), w3 = Register(3);
  v1::JobSpec spec = Spec(2);
  spec.set_steps(10);
  spec.set_max_restarts(1);
  const v1::Job job = Submit(spec);
  RunLater();
  ASSERT_EQ(Worker(1).assigned.size(), 1u);
  EXPECT_EQ(Worker(1).assigned[0].generation(), 1);
  EXPECT_EQ(Get(job.id()).generation(), 1);
  // Steps 0..4; rank 0 committed the checkpoint before step 3 (reported with step 2).
  for (int64_t t = 0; t < 5; ++t) {
    v1::StepReport r0 = Report(w1, job.id(), 0, t);
    if (t == 2) r0.set_checkpoint_committed("/ckpt/step-00000003");
    ASSERT_TRUE(ReportSteps(sessions_[w1], {r0}).ok());
    v1::StepReport r1 = Report(w2, job.id(), 1, t);
    r1.set_has_loss(true);
    r1.set_loss(10.0 - t);
    ASSERT_TRUE(ReportSteps(sessions_[w2], {r1}).ok());
  }
  EXPECT_EQ(Get(job.id()).checkpoint_step(), 3);
  EXPECT_EQ(Get(job.id()).checkpoint_path(), "/ckpt/step-00000003");
  // worker-2 goes silent: the job is not failed, it recovers.
  clock_->Advance(absl::Milliseconds(1500));
  Heartbeat(w1, job.id(), 0);
  Heartbeat(w3);
  clock_->Advance(absl::Milliseconds(600));
  coordinator_->Tick();
  v1::Job recovering = Get(job.id());
  EXPECT_EQ(recovering.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(recovering.restarts(), 1);
  EXPECT_THAT(recovering.message(), HasSubstr("recovering (restart 1 of 1): " + w2));
  ASSERT_EQ(recovering.recoveries_size(), 1);
  EXPECT_EQ(recovering.recoveries(0).generation(), 2);
  EXPECT_EQ(recovering.recoveries(0).failed_after_step(), 4);
  EXPECT_EQ(recovering.recoveries(0).resumed_at_step(), 3);
  EXPECT_EQ(recovering.step(), 2);  // steps 3 and 4 are run again
  RunLater();
  ASSERT_EQ(Worker(1).stopped.size(), 1u);
  EXPECT_EQ(Worker(1).stopped[0].generation(), 1);
  // Not placed while the survivor's stage has not ended; its late report is ignored.
  EXPECT_TRUE(Worker(3).assigned.empty());
  v1::StepReport late = Report(w1, job.id(), 0, 5);
  late.set_generation(1);
  EXPECT_TRUE(ReportSteps(sessions_[w1], {late}).ok());
  EXPECT_EQ(Get(job.id()).step(), 2);
  EndRank(w1, job.id(), 0, /*ok=*/false, "stopped", /*generation=*/1);
  RunLater();
  // Generation 2 on worker-1 and worker-3 (both idle), resuming from the checkpoint.
  ASSERT_EQ(Worker(1).assigned.size(), 2u);
  ASSERT_EQ(Worker(3).assigned.size(), 1u);
  for (const v1::StageAssignment* a : {&Worker(1).assigned[1], &Worker(3).assigned[0]}) {
    EXPECT_EQ(a->generation(), 2);
    EXPECT_EQ(a->spec().resume_from(), "/ckpt/step-00000003");
  }
  const std::string r0_worker = Worker(1).assigned[1].rank() == 0 ? w1 : w3;
  const std::string r1_worker = r0_worker == w1 ? w3 : w1;
  EXPECT_EQ(Get(job.id()).generation(), 2);
  // Its ranks start at the checkpoint's step: an earlier one counts as resent (skipped), a
  // later one is refused.
  v1::StepReport early = Report(r0_worker, job.id(), 0, 2);
  early.set_generation(2);
  EXPECT_TRUE(ReportSteps(sessions_[r0_worker], {early}).ok());
  v1::StepReport skipping = Report(r0_worker, job.id(), 0, 4);
  skipping.set_generation(2);
  EXPECT_EQ(ReportSteps(sessions_[r0_worker], {skipping}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Get(job.id()).stage_status(0).step(), 2);
  for (int64_t t = 3; t < 10; ++t) {
    v1::StepReport r0 = Report(r0_worker, job.id(), 0, t);
    r0.set_generation(2);
    ASSERT_TRUE(ReportSteps(sessions_[r0_worker], {r0}).ok());
    v1::StepReport r1 = Report(r1_worker, job.id(), 1, t);
    r1.set_generation(2);
    r1.set_has_loss(true);
    r1.set_loss(100.0 + t);
    ASSERT_TRUE(ReportSteps(sessions_[r1_worker], {r1}).ok());
  }
  EndRank(r0_worker, job.id(), 0, true, "", 2);
  EndRank(r1_worker, job.id(), 1, true, "", 2);
  const v1::Job done = Get(job.id());
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_GT(done.recoveries(0).first_step_unix_ms(), 0);
  // Every step once: 0..2 by generation 1, 3..9 (run again) by generation 2.
  absl::StatusOr<std::vector<StoredStep>> steps = coordinator_->Steps(job.id(), -1);
  ASSERT_TRUE(steps.ok()) << steps.status();
  ASSERT_EQ(steps->size(), 10u);
  for (int64_t t = 0; t < 10; ++t) {
    SCOPED_TRACE(t);
    EXPECT_EQ((*steps)[t].step, t);
    EXPECT_EQ((*steps)[t].generation, t < 3 ? 1 : 2);
    EXPECT_DOUBLE_EQ((*steps)[t].loss, t < 3 ? 10.0 - t : 100.0 + t);
  }
}

// With too few workers the next generation waits three heartbeat intervals for workers to
// come back, then runs fewer replicas with the same global batch; a job out of restarts
// fails naming the fault and the restarts it had.
TEST_F(CoordinatorCoreTest, ARecoveringJobShrinksAfterTheGraceAndFailsOnceOutOfRestarts) {
  std::vector<std::string> w;
  for (int n = 1; n <= 4; ++n) w.push_back(Register(n));
  v1::JobSpec spec = Spec(2, 2);  // 2 micro-batches per replica
  spec.set_max_restarts(1);
  const v1::Job job = Submit(spec);
  RunLater();
  EndRank(w[3], job.id(), 3, /*ok=*/false, "stage 1 replica 1: CUDA error", 1);
  for (int n = 0; n < 3; ++n) Heartbeat(w[n], job.id(), n);
  clock_->Advance(absl::Seconds(1));
  for (int n = 0; n < 3; ++n) Heartbeat(w[n], job.id(), n);
  coordinator_->Tick();  // the failure is the job's: generation 1 ends
  EXPECT_EQ(Get(job.id()).restarts(), 1);
  RunLater();
  // worker-4 leaves; the others end their stages.
  ASSERT_TRUE(coordinator_->Deregister(sessions_[w[3]], [&] {
    v1::DeregisterWorkerRequest r;
    r.set_worker_id(w[3]);
    return r;
  }()).ok());
  for (int n = 0; n < 3; ++n) EndRank(w[n], job.id(), n, false, "stopped", 1);
  RunLater();
  EXPECT_EQ(Get(job.id()).generation(), 1);  // 3 idle of 4: waits for the grace
  clock_->Advance(absl::Milliseconds(3100));
  for (int n = 0; n < 3; ++n) Heartbeat(w[n]);
  coordinator_->Tick();
  RunLater();
  const v1::Job shrunk = Get(job.id());
  EXPECT_EQ(shrunk.generation(), 2);
  EXPECT_EQ(shrunk.stages(), 2);
  EXPECT_EQ(shrunk.replicas(), 1);
  EXPECT_EQ(shrunk.recoveries(0).microbatches(), 4);
  ASSERT_EQ(shrunk.stage_status_size(), 2);
  const v1::StageAssignment& a = Worker(1).assigned.back();
  EXPECT_EQ(a.generation(), 2);
  EXPECT_EQ(a.spec().replicas(), 1);
  EXPECT_EQ(a.spec().microbatches(), 4);
  EXPECT_FALSE(a.spec().has_resume_from());  // no checkpoint yet: from the start
  // Another fault: no restarts left.
  EndRank(shrunk.stage_status(0).worker_id(), job.id(), 0, false, "out of memory", 2);
  EndRank(shrunk.stage_status(1).worker_id(), job.id(), 1, false, "lost stage 0", 2);
  const v1::Job failed = Get(job.id());
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.message(), HasSubstr("out of memory (after 1 restart; max_restarts is 1)"));
}

// The next generation goes only to workers whose memory holds a rank's parameter state; if
// none fits, the job fails once its timeout_s has passed, saying why.
TEST_F(CoordinatorCoreTest, ARecoveringJobUsesOnlyWorkersWithMemoryForARank) {
  auto register_with = [&](int n, int64_t memory) {
    v1::RegisterWorkerRequest r;
    r.set_address("host-" + std::to_string(n) + ":7000");
    r.set_memory_bytes(memory);
    auto response = RegisterAsNewProcess(r);
    EXPECT_TRUE(response.ok()) << response.status();
    sessions_[response->worker_id()] = response->session();
    return response->worker_id();
  };
  const std::string w1 = register_with(1, int64_t{1} << 30), w2 = register_with(2, 1 << 30);
  v1::JobSpec spec = Spec(2);
  spec.set_max_restarts(2);
  spec.set_timeout_s(10);
  const v1::Job job = Submit(spec);
  RunLater();
  const std::string small = register_with(3, 1000), big = register_with(4, int64_t{1} << 30);
  EndRank(w2, job.id(), 1, false, "CUDA error", 1);
  Heartbeat(w1, job.id(), 0);
  clock_->Advance(absl::Seconds(1));
  Heartbeat(w1, job.id(), 0);
  coordinator_->Tick();
  EndRank(w1, job.id(), 0, false, "stopped", 1);
  RunLater();
  // Idle: worker-1, -2, -3 (1000 bytes), -4: the small one is passed over.
  v1::Job second = Get(job.id());
  ASSERT_EQ(second.generation(), 2);
  for (const v1::StageStatus& st : second.stage_status()) EXPECT_NE(st.worker_id(), small);
  // The big workers leave (the first of generation 2 to go ends it: restart 2 of 2); only the
  // small one is left: no layout fits, and the job fails after timeout_s, saying why.
  for (const std::string& w : {big, w1, w2}) {
    v1::DeregisterWorkerRequest leave;
    leave.set_worker_id(w);
    ASSERT_TRUE(coordinator_->Deregister(sessions_[w], leave).ok());
  }
  clock_->Advance(absl::Seconds(11));
  Heartbeat(small);
  coordinator_->Tick();
  const v1::Job failed = Get(job.id());
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.message(), HasSubstr("no workers to restart on within timeout_s"));
  EXPECT_THAT(failed.message(), HasSubstr("bytes for a rank's parameters, gradients and "
                                          "optimizer state, 0 idle have them"));
}

// A skipped step (non-finite loss or gradients) is counted once, from rank 0's report.
TEST_F(CoordinatorCoreTest, SkippedStepsAreCountedOnceAndSaidInTheEvents) {
  const std::string w1 = Register(1), w2 = Register(2);
  const v1::Job job = Submit(Spec(2));
  RunLater();
  for (int64_t t = 0; t < 2; ++t) {
    for (auto [worker, rank] : {std::pair{w1, 0}, std::pair{w2, 1}}) {
      v1::StepReport r = Report(worker, job.id(), rank, t);
      r.set_skipped(t == 1);
      ASSERT_TRUE(ReportSteps(sessions_[worker], {r}).ok());
    }
  }
  EXPECT_EQ(Get(job.id()).skipped_steps(), 1);
  const std::vector<std::string> events = EventTexts(job.id());
  EXPECT_EQ(std::count_if(events.begin(), events.end(),
                          [](const std::string& e) {
                            return e.find("step 1 skipped: its loss or gradients were not "
                                          "finite") != std::string::npos;
                          }),
            1);
}

TEST(RecoveryLayoutsTest, TheSameLayoutElseTheMostRanksWithTheSameGlobalBatch) {
  auto text = [](const std::vector<Layout>& layouts) {
    std::string out;
    for (const Layout& l : layouts) {
      out += std::to_string(l.stages) + "x" + std::to_string(l.replicas) + "x" +
             std::to_string(l.micro_batches) + " ";
    }
    return out;
  };
  EXPECT_EQ(text(RecoveryLayouts({2, 2, 4}, 4, false)), "2x2x4 2x1x8 1x2x4 1x1x8 ");
  EXPECT_EQ(text(RecoveryLayouts({2, 2, 4}, 3, false)), "2x1x8 1x2x4 1x1x8 ");
  EXPECT_EQ(text(RecoveryLayouts({4, 1, 8}, 3, false)), "3x1x8 2x1x8 1x1x8 ");
  EXPECT_EQ(text(RecoveryLayouts({4, 1, 8}, 3, true)), "");  // explicit ranges: 4 stages
  EXPECT_EQ(text(RecoveryLayouts({2, 3, 1}, 5, false)), "1x3x1 2x1x3 1x1x3 ");  // w | w*m
  EXPECT_EQ(text(RecoveryLayouts({2, 2, 4}, 0, false)), "");
}

// A coordinator that restarts resumes a running job that has restarts left.
TEST_F(CoordinatorCoreTest, ARestartResumesARunningJobWithRestartsLeft) {
  const std::string w1 = Register(1);
  v1::JobSpec spec = Spec(1);
  spec.set_max_restarts(3);
  const v1::Job running = Submit(spec);
  RunLater();
  coordinator_.reset();
  Open();
  v1::Job recovering = Get(running.id());
  EXPECT_EQ(recovering.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(recovering.restarts(), 1);
  EXPECT_THAT(recovering.message(), HasSubstr("the coordinator restarted"));
  // Its worker registers again; after the grace the job runs as generation 2 on it.
  const std::string again = Register(1);
  clock_->Advance(absl::Milliseconds(3100));
  Heartbeat(again);
  coordinator_->Tick();
  RunLater();
  const v1::Job resumed = Get(running.id());
  EXPECT_EQ(resumed.generation(), 2);
  EXPECT_EQ(resumed.stage_status(0).worker_id(), again);
}

TEST_F(CoordinatorCoreTest, ASubmissionWhoseWriteFailsIsRefusedAndLeavesNothing) {
  Register(1);
  data_->fail_puts = true;
  auto refused = coordinator_->Submit(Spec(1));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("disk I/O error"));
  EXPECT_EQ(coordinator_->List()->jobs_size(), 0);
  RunLater();
  EXPECT_TRUE(Worker(1).assigned.empty());  // never placed
  EXPECT_TRUE(data_->events.empty());
  data_->fail_puts = false;
  const v1::Job accepted = Submit(Spec(1));
  EXPECT_EQ(accepted.state(), v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(data_->jobs.count(accepted.id()));
}

TEST_F(CoordinatorCoreTest, AProgressWriteThatFailsIsWrittenByTheNextFlush) {
  const std::string w1 = Register(1);
  const v1::Job job = Submit(Spec(1));
  RunLater();
  data_->fail_puts = true;
  EndRank(w1, job.id(), 0);  // SUCCEEDED in memory, its write fails
  data_->fail_puts = false;
  coordinator_->Tick();  // any later flush writes it
  v1::Job stored;
  ASSERT_TRUE(stored.ParseFromString(data_->jobs.at(job.id()).job));
  EXPECT_EQ(stored.state(), v1::JOB_STATE_SUCCEEDED);
}

}  // namespace
}  // namespace pipetrain::coordinator
