// The fixture of the coordinator's core tests: a coordinator with fakes all round (a clock
// the test moves, fake workers that record every call and fail on demand, an in-memory job
// store that can fail a write, calls to workers queued until the test runs them), and the
// helpers the tests share. No gtest main here.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/coordinator.h"
#include "coordinator/placement.h"
#include "rpc/security.h"
#include "runtime/planner/profile_json.h"
#include "tests/coordinator/coordinator_fakes.h"

namespace pipetrain::coordinator::core_test {

using testing_fakes::FakeClock;
using testing_fakes::FakeStore;
using testing_fakes::FakeWorker;
using testing_fakes::KeyedClient;

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
    deps.connect = [this](const std::string& address,
                          const std::string& key) -> absl::StatusOr<std::shared_ptr<WorkerClient>> {
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
    return coordinator_->workers().Register(r);
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
    auto job = coordinator_->jobs().Submit(spec, profile);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : v1::Job();
  }

  v1::Job Get(const std::string& id) { return *coordinator_->jobs().Get(id); }

  void Heartbeat(const std::string& worker, const std::string& job = "", int rank = -1) {
    v1::HeartbeatRequest h;
    h.set_worker_id(worker);
    h.set_job_id(job);
    h.set_rank(rank);
    EXPECT_TRUE(coordinator_->workers().Heartbeat(sessions_[worker], h).ok());
  }

  // Workers 1, 2 and 3 and a job of 2 stages and `steps` steps with one restart, its first
  // generation assigned (ranks 0 and 1 on worker-1 and worker-2).
  struct RecoverableJob {
    std::string w1, w2, w3;
    v1::Job job;
  };
  RecoverableJob StartRecoverableJob(int steps) {
    RecoverableJob r{Register(1), Register(2), Register(3), {}};
    v1::JobSpec spec = Spec(2);
    spec.set_steps(steps);
    spec.set_max_restarts(1);
    r.job = Submit(spec);
    RunLater();
    return r;
  }
  // Worker-2 of `r` falls silent (worker-1, running rank 0, and worker-3 heartbeat on) until
  // the coordinator takes it for lost and the job's generation ends.
  void SilenceWorkerTwo(const RecoverableJob& r) {
    clock_->Advance(absl::Milliseconds(1500));
    Heartbeat(r.w1, r.job.id(), 0);
    Heartbeat(r.w3);
    clock_->Advance(absl::Milliseconds(600));
    coordinator_->Tick();
  }

  // `intervals` seconds pass, each with a heartbeat from every worker of `alive` (idle), the
  // coordinator's tick and the calls it made: a silent worker's lease runs out meanwhile.
  void PassSeconds(int intervals, const std::vector<std::string>& alive) {
    for (int beat = 0; beat < intervals; ++beat) {
      clock_->Advance(absl::Milliseconds(1000));
      for (const std::string& w : alive) Heartbeat(w);
      coordinator_->Tick();
      RunLater();
    }
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
    EXPECT_TRUE(coordinator_->reports().ReportStageEnd(sessions_[worker], end).ok());
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
    return coordinator_->reports().ReportSteps(session, batch).status();
  }

  std::vector<std::string> EventTexts(const std::string& job) {
    std::vector<std::string> texts;
    absl::StatusOr<std::vector<v1::JobEvent>> events = coordinator_->jobs().Events(job, 0);
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

}  // namespace pipetrain::coordinator::core_test
