// A stage's step reports, sent to the coordinator from a thread of their own, in order, so
// that the stage never waits for an RPC (a slow or absent coordinator must not stall the
// pipeline). Reports that got no answer (UNAVAILABLE, DEADLINE_EXCEEDED) are sent again, in
// order, with the next batch: the coordinator skips the ones it has counted, so a lost reply
// costs nothing. Reports it refused are not sent again. Each batch carries the process's
// memory high-water, read once per batch (a report's tensor peak is read at its step: a batch
// sent after the stage has ended must not count what the rank does after its last step).
// Thread-safe; `on_stop` runs on the reporter's thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "pipetrain/v1/coordinator_service.pb.h"
#include "pipetrain/v1/worker_service.pb.h"
#include "runtime/executor/stage_executor.h"
#include "runtime/model/partition.h"
#include "worker/coordinator_client.h"

namespace pipetrain::worker {

// What a rank says once, with its next step report.
struct StepNews {
  std::string committed_checkpoint;      // the checkpoint it committed (the job's restart point)
  std::string failed_checkpoint;         // why its part of a checkpoint failed
  std::string resumed_from;              // rank 0: where the job resumed from ...
  std::vector<std::string> passed_over;  // ... and the newer checkpoints it passed over
  // How its state came from the survivors' workers (ReplicaStateFetch::Describe), if it did.
  std::string state_from_replicas;
};

// The report of `step` of `assignment` run by `worker_id`: its times, loss and commands, the
// stage's parameter bytes and layers, the device's tensor peak since the rank began
// (`peak_tensor_bytes`, read at the step; negative: not known, sent as 0), its time
// breakdown so far, and `news` (cut to what the coordinator takes: 1 KiB per failure or
// checkpoint passed over or state taken from replicas, 16 of those, 4 KiB for a path).
v1::StepReport MakeStepReport(const v1::StageAssignment& assignment, const std::string& worker_id,
                              const executor::StepRecord& step, int64_t parameter_bytes,
                              int64_t peak_tensor_bytes, model::LayerRange layers,
                              const v1::StageBreakdown& breakdown, StepNews news);

// `on_stop` runs when the coordinator answers that the job no longer runs.
class StepReporter {
 public:
  StepReporter(std::shared_ptr<CoordinatorClient> coordinator, std::function<void()> on_stop)
      : coordinator_(std::move(coordinator)),
        on_stop_(std::move(on_stop)),
        thread_([this] { Loop(); }) {}
  // Sends what is queued (again while unanswered, for at most kClosingPatience), then stops.
  ~StepReporter() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closing_ = true;
      close_by_ = std::chrono::steady_clock::now() + kClosingPatience;
    }
    cv_.notify_all();
    thread_.join();
  }
  // What is queued gets one more try and no resend: the stage was stopped, its generation is
  // over for the coordinator (or the coordinator is out of reach). Then closes.
  void Abandon() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      abandoned_ = true;
    }
    cv_.notify_all();
  }
  // Queues a report. While kMaxQueued are waiting (steps faster than the coordinator takes
  // them), waits for room up to `patience`: the stage runs at the pace the coordinator can
  // follow. False if there was no room by then (the report is dropped).
  bool Add(v1::StepReport report, absl::Duration patience) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!room_.wait_for(lock, absl::ToChronoNanoseconds(patience),
                          [this] { return queue_.size() < kMaxQueued; })) {
        return false;
      }
      queue_.push_back(std::move(report));
    }
    cv_.notify_all();
    return true;
  }

 private:
  // Sends what has queued up in one ReportSteps, at most every kMinInterval: a fast step
  // costs no RPC of its own (on a few shared cores every RPC takes CPU from the stages).
  static constexpr auto kMinInterval = std::chrono::milliseconds(100);
  // Reports waiting to be sent, or kept for resending while the coordinator does not answer:
  // at the bound the stage waits for room (Add), and no report is ever dropped to make room
  // (the queue holds at most kMaxQueued + kMaxBatch). About 150 bytes each.
  static constexpr size_t kMaxQueued = 4000;
  static constexpr size_t kMaxBatch = 1000;
  // How long a closing reporter goes on resending what got no answer.
  static constexpr auto kClosingPatience = std::chrono::seconds(5);
  // No answer (RESOURCE_EXHAUSTED is not one: a batch over the coordinator's request limit
  // would be refused again however often it were sent).
  static bool IsTransient(const absl::Status& s) {
    return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s);
  }
  void Loop();

  std::shared_ptr<CoordinatorClient> coordinator_;
  std::function<void()> on_stop_;
  std::mutex mu_;
  std::condition_variable cv_;    // the reporter's thread: reports, or closing
  std::condition_variable room_;  // Add(): the queue has room
  std::deque<v1::StepReport> queue_;
  bool closing_ = false;
  std::chrono::steady_clock::time_point close_by_;  // closing: resend until then
  bool abandoned_ = false;                          // Abandon(): resend nothing
  std::thread thread_;                              // last: starts once the rest is ready
};

}  // namespace pipetrain::worker
