// libFuzzer target: the request handlers of the coordinator core (coordinator/coordinator.h)
// through its API, with no sockets: a fake clock, fake workers and an in-memory store
// (tests/coordinator/coordinator_fakes.h). Each input starts from a coordinator with two
// registered workers running a two-stage job, then plays a sequence of calls drawn from the
// input: every JobService and CoordinatorService method, the rendezvous store's calls, clock
// ticks, with identities mixed from the real ones and forged ones, and numbers and strings
// from the input (protobuf messages parsed from raw bytes too).
// Properties: never a crash, a hang or a sanitizer report; every refusal says why; a job's
// step never passes its steps; a page of jobs stays near its byte budget.
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fuzzer/FuzzedDataProvider.h>

#include "coordinator/coordinator.h"
#include "tests/coordinator/coordinator_fakes.h"

namespace pc = pipetrain::coordinator;
namespace v1 = pipetrain::v1;

namespace {

void CheckRefusal(const absl::Status& status) {
  if (!status.ok() && status.message().empty()) std::abort();
}

void CheckJob(const v1::Job& job) {
  if (job.step() >= job.steps() && job.steps() > 0) std::abort();
  for (const auto& stage : job.stage_status()) {
    if (stage.step() >= job.steps() && job.steps() > 0) std::abort();
  }
}

using pc::testing_fakes::ValidSpec;

class Harness {
 public:
  explicit Harness(FuzzedDataProvider& in) : in_(in) {
    pc::CoordinatorDeps deps;
    deps.store = std::make_unique<pc::testing_fakes::FakeStore>(data_);
    deps.clock = clock_;
    deps.connect =
        [this](const std::string& address,
               const std::string& key) -> absl::StatusOr<std::shared_ptr<pc::WorkerClient>> {
      auto& w = workers_[address];
      if (!w) w = std::make_shared<pc::testing_fakes::FakeWorker>();
      return std::shared_ptr<pc::WorkerClient>(
          std::make_shared<pc::testing_fakes::KeyedClient>(w, key));
    };
    deps.run_later = [this](std::function<void()> call) { later_.push_back(std::move(call)); };
    deps.start_monitor = false;
    pc::CoordinatorOptions options;
    auto c = pc::Coordinator::Open(options, std::move(deps));
    if (!c.ok()) std::abort();
    coordinator_ = *std::move(c);
    for (int n = 1; n <= 2; ++n) {
      v1::RegisterWorkerRequest r;
      r.set_address("host-" + std::to_string(n) + ":7000");
      r.set_command_key(std::string(32, static_cast<char>('0' + n)));
      auto response = coordinator_->workers().Register(r);
      if (!response.ok()) std::abort();
      worker_ids_.push_back(response->worker_id());
      sessions_.push_back(response->session());
    }
    auto job = coordinator_->jobs().Submit(ValidSpec(2));
    if (!job.ok()) std::abort();
    job_ids_.push_back(job->id());
    RunLater();
  }

  void Run() {
    while (in_.remaining_bytes() > 0) Step();
    // Everything that was accepted is still consistent.
    auto list = coordinator_->jobs().List(500);
    if (!list.ok()) std::abort();
    for (const v1::Job& job : list->jobs()) CheckJob(job);
  }

 private:
  std::string AnyString(size_t max = 64) { return in_.ConsumeRandomLengthString(max); }
  // A worker id / session / job id: a real one most of the time, else anything.
  std::string WorkerId() { return Pick(worker_ids_); }
  std::string Session() { return Pick(sessions_); }
  std::string JobId() { return Pick(job_ids_); }
  std::string Pick(const std::vector<std::string>& real) {
    if (!real.empty() && in_.ConsumeIntegralInRange<int>(0, 3) != 0) {
      return real[in_.ConsumeIntegralInRange<size_t>(0, real.size() - 1)];
    }
    return AnyString();
  }
  int64_t Number() {
    switch (in_.ConsumeIntegralInRange<int>(0, 3)) {
      case 0: return in_.ConsumeIntegralInRange<int64_t>(-2, 8);
      case 1: return in_.ConsumeIntegral<int64_t>();
      case 2: return in_.ConsumeIntegral<int32_t>();
      default: return in_.ConsumeIntegralInRange<int64_t>(0, 1000);
    }
  }
  template <typename Message>
  Message Parsed() {
    Message m;
    const std::string bytes = in_.ConsumeRandomLengthString(256);
    m.ParseFromString(bytes);  // whatever parses, however partly
    return m;
  }
  void RunLater() {
    for (int rounds = 0; rounds < 16 && !later_.empty(); ++rounds) {
      std::vector<std::function<void()>> calls;
      calls.swap(later_);
      for (auto& call : calls) call();
    }
  }

  void Step() {
    switch (in_.ConsumeIntegralInRange<int>(0, 18)) {
      case 0: {  // a spec of random fields, or a valid one with one field changed
        v1::JobSpec spec = in_.ConsumeBool() ? Parsed<v1::JobSpec>()
                                             : ValidSpec(1 + in_.ConsumeIntegralInRange<int>(0, 2));
        if (in_.ConsumeBool()) spec.set_steps(static_cast<int32_t>(Number()));
        if (in_.ConsumeBool()) spec.set_max_restarts(static_cast<int32_t>(Number()));
        auto job = coordinator_->jobs().Submit(spec);
        CheckRefusal(job.status());
        if (job.ok()) job_ids_.push_back(job->id());
        break;
      }
      case 1: {
        v1::RegisterWorkerRequest r =
            in_.ConsumeBool() ? Parsed<v1::RegisterWorkerRequest>() : v1::RegisterWorkerRequest();
        if (r.address().empty()) r.set_address("host-" + std::to_string(Number()) + ":7000");
        if (r.command_key().empty() && in_.ConsumeBool()) r.set_command_key(std::string(32, 'f'));
        auto response = coordinator_->workers().Register(r);
        CheckRefusal(response.status());
        if (response.ok()) {
          worker_ids_.push_back(response->worker_id());
          sessions_.push_back(response->session());
        }
        break;
      }
      case 2: {
        v1::HeartbeatRequest h =
            in_.ConsumeBool() ? Parsed<v1::HeartbeatRequest>() : v1::HeartbeatRequest();
        if (in_.ConsumeBool()) {
          h.set_worker_id(WorkerId());
          h.set_job_id(JobId());
          h.set_rank(static_cast<int32_t>(Number()));
          h.set_action(AnyString());
        }
        CheckRefusal(coordinator_->workers().Heartbeat(Session(), h));
        break;
      }
      case 3: {  // a batch of step reports
        v1::StepReports reports;
        const int n = in_.ConsumeIntegralInRange<int>(0, 4);
        for (int i = 0; i < n; ++i) {
          v1::StepReport* r = reports.add_reports();
          r->set_worker_id(WorkerId());
          r->set_job_id(JobId());
          r->set_rank(static_cast<int32_t>(in_.ConsumeIntegralInRange<int>(-1, 2)));
          r->set_step(Number());
          r->set_has_loss(in_.ConsumeBool());
          r->set_loss(in_.ConsumeFloatingPoint<double>());
          r->set_end_s(in_.ConsumeFloatingPoint<double>());
          r->set_compute_s(in_.ConsumeFloatingPoint<double>());
          r->set_wait_s(in_.ConsumeFloatingPoint<double>());
          if (in_.ConsumeBool()) r->add_commands_after(static_cast<v1::StepCommand>(Number()));
          r->set_generation(static_cast<int32_t>(in_.ConsumeIntegralInRange<int>(0, 3)));
          if (in_.ConsumeBool()) r->set_checkpoint_committed(AnyString());
          if (in_.ConsumeBool()) r->set_checkpoint_failed(AnyString());
          r->set_skipped(in_.ConsumeBool());
        }
        auto response = coordinator_->reports().ReportSteps(Session(), reports);
        CheckRefusal(response.status());
        break;
      }
      case 4: {
        auto response = coordinator_->reports().ReportSteps(Session(), Parsed<v1::StepReports>());
        CheckRefusal(response.status());
        break;
      }
      case 5: {
        v1::StageEnd end = in_.ConsumeBool() ? Parsed<v1::StageEnd>() : v1::StageEnd();
        if (in_.ConsumeBool()) {
          end.set_worker_id(WorkerId());
          end.set_job_id(JobId());
          end.set_rank(static_cast<int32_t>(in_.ConsumeIntegralInRange<int>(-1, 2)));
          end.set_ok(in_.ConsumeBool());
          end.set_error(AnyString(in_.ConsumeBool() ? 64 : 8192));
        }
        CheckRefusal(coordinator_->reports().ReportStageEnd(Session(), end).status());
        break;
      }
      case 6: {  // the rendezvous store of a job, as its ranks use it
        auto store = coordinator_->workers().Rendezvous(Session(), JobId(),
                                                        in_.ConsumeIntegralInRange<int>(0, 2));
        CheckRefusal(store.status());
        if (!store.ok()) break;
        const std::string key = AnyString(in_.ConsumeBool() ? 16 : 2048);
        switch (in_.ConsumeIntegralInRange<int>(0, 4)) {
          case 0: CheckRefusal((*store)->Set(key, AnyString(in_.ConsumeBool() ? 64 : 4096))); break;
          case 1: CheckRefusal((*store)->Get(key, absl::ZeroDuration()).status()); break;
          case 2: CheckRefusal((*store)->Add(key, Number()).status()); break;
          case 3: CheckRefusal((*store)->Check({key, AnyString()}).status()); break;
          default: CheckRefusal((*store)->Delete(key)); break;
        }
        break;
      }
      case 7: {
        auto job = coordinator_->jobs().Get(JobId());
        CheckRefusal(job.status());
        if (job.ok()) CheckJob(*job);
        break;
      }
      case 8: {
        auto page = coordinator_->jobs().List(static_cast<int>(Number()),
                                              in_.ConsumeBool() ? AnyString() : "");
        CheckRefusal(page.status());
        if (page.ok() && page->ByteSizeLong() > 2 * pc::JobManager::kListPageBytes) std::abort();
        break;
      }
      case 9: CheckRefusal(coordinator_->jobs().Cancel(JobId()).status()); break;
      case 10: {
        auto events = coordinator_->jobs().Events(JobId(), Number());
        CheckRefusal(events.status());
        if (events.ok() && static_cast<int64_t>(events->size()) > pc::JobManager::kEventsPerCall) {
          std::abort();
        }
        break;
      }
      case 11: {
        v1::SendCommandRequest r =
            in_.ConsumeBool() ? Parsed<v1::SendCommandRequest>() : v1::SendCommandRequest();
        if (in_.ConsumeBool()) {
          r.set_job_id(JobId());
          r.set_command(static_cast<v1::StepCommand>(in_.ConsumeIntegralInRange<int>(-1, 5)));
          r.set_step(Number());
        }
        CheckRefusal(coordinator_->jobs().SendCommand(r).status());
        break;
      }
      case 12: {
        v1::DeregisterWorkerRequest r;
        r.set_worker_id(WorkerId());
        CheckRefusal(coordinator_->workers().Deregister(Session(), r));
        break;
      }
      case 13: coordinator_->workers().Workers(); break;
      case 14:  // time passes (heartbeats missed, held-back failures decided, TTLs)
        clock_->Advance(absl::Milliseconds(in_.ConsumeIntegralInRange<int>(0, 120000)));
        coordinator_->Tick();
        break;
      case 15: RunLater(); break;
      case 16:  // a worker that fails its next assignment
        for (auto& [address, worker] : workers_) worker->fail_assign = in_.ConsumeBool();
        break;
      case 17: {  // a worker that drains (SIGTERM)
        v1::DrainWorkerRequest r;
        r.set_worker_id(WorkerId());
        CheckRefusal(coordinator_->workers().DrainWorker(Session(), r).status());
        break;
      }
      default: {
        auto job = coordinator_->jobs().Submit(Parsed<v1::JobSpec>());
        CheckRefusal(job.status());
        if (job.ok()) job_ids_.push_back(job->id());
        break;
      }
    }
  }

  FuzzedDataProvider& in_;
  std::shared_ptr<pc::testing_fakes::FakeStore::Data> data_ =
      std::make_shared<pc::testing_fakes::FakeStore::Data>();
  std::shared_ptr<pc::testing_fakes::FakeClock> clock_ =
      std::make_shared<pc::testing_fakes::FakeClock>();
  std::map<std::string, std::shared_ptr<pc::testing_fakes::FakeWorker>> workers_;
  std::vector<std::function<void()>> later_;
  std::unique_ptr<pc::Coordinator> coordinator_;
  std::vector<std::string> worker_ids_, sessions_, job_ids_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  Harness harness(in);
  harness.Run();
  return 0;
}
