// Fakes for the coordinator core (coordinator/coordinator.h), shared by its unit tests
// (tests/coordinator) and its fuzzer (fuzz/coordinator_fuzzer.cc): a clock the caller moves,
// workers that record every call and fail on demand, and an in-memory job store that can
// fail or hang a write. No gtest here.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/job_store.h"
#include "coordinator/worker_client.h"
#include "pipetrain/v1/job.pb.h"
#include "runtime/base/clock.h"

namespace pipetrain::coordinator::testing_fakes {

// A valid spec of `stages` stages x `replicas` replicas (a GPT of 4 layers, 4 steps).
inline v1::JobSpec ValidSpec(int stages, int replicas = 1) {
  v1::JobSpec s;
  s.mutable_model()->set_name("gpt");
  s.mutable_model()->set_d_model(16);
  s.mutable_model()->set_n_heads(2);
  s.mutable_model()->set_n_layers(2);
  s.set_schedule("1f1b");
  s.set_stages(stages);
  s.set_replicas(replicas);
  s.set_microbatches(2);
  s.set_microbatch_size(2);
  s.set_steps(4);
  return s;
}

using ::pipetrain::FakeClock;

class FakeWorker : public WorkerClient {
 public:
  absl::Status AssignStage(const v1::StageAssignment& a) override {
    assigned.push_back(a);
    return fail_assign ? absl::UnavailableError("connection refused") : absl::OkStatus();
  }
  absl::Status StopStage(const v1::StopStageRequest& r) override {
    stopped.push_back(r);
    return absl::OkStatus();
  }
  absl::StatusOr<v1::SendCommandResponse> ScheduleCommand(
      const v1::SendCommandRequest& r) override {
    commands.push_back(r);
    v1::SendCommandResponse response;
    response.set_step(r.step() > 0 ? r.step() : 3);
    return response;
  }
  absl::Status Ping() override { return absl::OkStatus(); }
  bool fail_assign = false;
  std::vector<v1::StageAssignment> assigned;
  std::vector<v1::StopStageRequest> stopped;
  std::vector<v1::SendCommandRequest> commands;
  // The command key of the worker process serving at this address now ("" : none serves).
  std::string process_key;
};

// The coordinator's client of the worker that registered at an address with `key`: calls go
// to the fake at that address; a ping succeeds only while the process there holds `key` (a
// worker restarted there holds another).
class KeyedClient : public WorkerClient {
 public:
  KeyedClient(std::shared_ptr<FakeWorker> worker, std::string key)
      : worker_(std::move(worker)), key_(std::move(key)) {}
  absl::Status AssignStage(const v1::StageAssignment& a) override {
    return worker_->AssignStage(a);
  }
  absl::Status StopStage(const v1::StopStageRequest& r) override { return worker_->StopStage(r); }
  absl::StatusOr<v1::SendCommandResponse> ScheduleCommand(
      const v1::SendCommandRequest& r) override {
    return worker_->ScheduleCommand(r);
  }
  absl::Status Ping() override {
    return worker_->process_key == key_ ? absl::OkStatus()
                                        : absl::UnauthenticatedError("another process");
  }

 private:
  std::shared_ptr<FakeWorker> worker_;
  std::string key_;
};

// An in-memory JobStore whose contents outlive it (a "restart" opens a new one on them).
class FakeStore : public JobStore {
 public:
  struct Data {
    std::map<std::string, StoredJob> jobs;
    std::map<std::string, int64_t> order;
    std::map<std::string, std::vector<StoredEvent>> events;
    std::map<std::string, int64_t> counters;
    std::map<std::string, std::map<int64_t, StoredStep>> steps;
    bool fail_puts = false;
    int puts = 0;
    // While set, a job write waits (a disk that hangs).
    std::mutex mu;
    std::condition_variable released;
    bool hang_puts = false;
    int hanging = 0;  // writes waiting now
  };
  explicit FakeStore(std::shared_ptr<Data> data) : d_(std::move(data)) {}
  absl::Status PutJob(const std::string& id, int64_t order, const std::string& job) override {
    {
      std::unique_lock<std::mutex> lock(d_->mu);
      ++d_->hanging;
      d_->released.wait(lock, [this] { return !d_->hang_puts; });
      --d_->hanging;
    }
    if (d_->fail_puts) return absl::InternalError("job store: disk I/O error");
    ++d_->puts;
    d_->jobs[id] = {id, job};
    d_->order[id] = order;
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<StoredJob>> LoadJobs() override {
    std::vector<std::pair<int64_t, StoredJob>> byorder;
    for (const auto& [id, j] : d_->jobs) byorder.push_back({d_->order[id], j});
    std::sort(byorder.begin(), byorder.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<StoredJob> out;
    for (auto& [o, j] : byorder) out.push_back(j);
    return out;
  }
  absl::StatusOr<int64_t> AppendEvent(const std::string& job_id, int64_t unix_ms,
                                      const std::string& text) override {
    auto& list = d_->events[job_id];
    list.push_back({static_cast<int64_t>(list.size()) + 1, unix_ms, text});
    return list.back().seq;
  }
  absl::StatusOr<std::vector<StoredEvent>> Events(const std::string& job_id, int64_t after_seq,
                                                  int64_t limit) override {
    std::vector<StoredEvent> out;
    for (const StoredEvent& e : d_->events[job_id]) {
      if (e.seq > after_seq && static_cast<int64_t>(out.size()) < limit) out.push_back(e);
    }
    return out;
  }
  absl::StatusOr<int64_t> Increment(const std::string& name, int64_t by) override {
    return d_->counters[name] += by;
  }
  absl::Status PutSteps(const std::string& job_id, const std::vector<StoredStep>& steps) override {
    if (d_->fail_puts) return absl::InternalError("job store: disk I/O error");
    for (const StoredStep& s : steps) d_->steps[job_id][s.step] = s;
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<StoredStep>> Steps(const std::string& job_id, int64_t after_step,
                                                int64_t limit) override {
    std::vector<StoredStep> out;
    for (const auto& [step, s] : d_->steps[job_id]) {
      if (step > after_step && static_cast<int64_t>(out.size()) < limit) out.push_back(s);
    }
    return out;
  }

 private:
  std::shared_ptr<Data> d_;
};

}  // namespace pipetrain::coordinator::testing_fakes
