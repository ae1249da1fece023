// The survivors' state a worker holds for the next generation of a job: after a fault, a
// survivor told to hold its state (SurvivorInstruction.hold_state) keeps its layers, each as
// the bytes of its checkpoint file, and serves them to the next generation's ranks
// (WorkerService.FetchLayerState, worker_service.h), which then read no checkpoint.
//
// One hold per job (a newer one replaces it). A hold ends when its time is up, or when the
// coordinator's answer to a heartbeat sent after it was taken no longer names its job
// (HeartbeatResponse.held_state_jobs: the next generation has committed its first step, or
// the job went on otherwise). Its bytes are this worker's memory besides the rank it runs,
// and are counted (bytes()) for its metrics.
//
// Thread-safe. Time comes from the clock given (it outlives this).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/base/clock.h"

namespace pipetrain::worker {

class HeldStates {
 public:
  explicit HeldStates(std::shared_ptr<const Clock> clock) : clock_(std::move(clock)) {}

  // Holds `layers` (global layer index -> bytes) of job `job_id` at `step` for `hold_for`,
  // served only to calls carrying `key`; replaces the job's hold, if any.
  void Hold(const std::string& job_id, int64_t step, const std::string& key,
            absl::Duration hold_for, std::map<int, std::string> layers);

  // Layer `layer` of `job_id`'s hold at `step`. NotFound (no such hold, step or layer, or
  // its time is up), PermissionDenied (another key).
  absl::StatusOr<std::shared_ptr<const std::string>> Layer(const std::string& job_id,
                                                           int64_t step, int layer,
                                                           const std::string& key) const;
  // The coordinator's answer to a heartbeat sent at `sent`: the holds of jobs not in `jobs`
  // taken before then end (one taken after may be newer than what the answer knew).
  void KeepOnly(const std::vector<std::string>& jobs, absl::Time sent);

  // Bytes held now (holds whose time is up count until the next call drops them).
  int64_t bytes() const;
  // How many jobs it holds state of.
  int jobs() const;

 private:
  struct Entry {
    int64_t step = 0;
    std::string key;
    absl::Time taken, until;
    std::map<int, std::shared_ptr<const std::string>> layers;
    int64_t bytes = 0;
  };
  // REQUIRES: mu_ held.
  void DropExpired() const;

  const std::shared_ptr<const Clock> clock_;
  mutable std::mutex mu_;
  mutable std::map<std::string, Entry> holds_;  // by job
};

}  // namespace pipetrain::worker
