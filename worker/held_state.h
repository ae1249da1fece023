// The survivors' state a worker holds for the next generation of a job: after a fault, a
// survivor told to hold its state (SurvivorInstruction.hold_state) keeps its layers, each as
// the bytes of its checkpoint file, and serves them to the next generation's ranks
// (WorkerService.FetchLayerState, worker_service.h), which then read no checkpoint.
//
// One hold per job (a newer one replaces it). A hold ends when its time is up, or when the
// coordinator's answer to a heartbeat sent after it was taken no longer names its job
// (HeartbeatResponse.held_state_jobs: the next generation has committed its first step, or
// the job went on otherwise). Its bytes are this worker's memory besides the rank it runs,
// and are counted (bytes()) for its metrics. When a hold's bytes are freed (its end, and
// the last fetch still serving them done), the process gives the freed memory back to the
// system (malloc_trim): a training process keeps free heap otherwise (allocator.h).
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

  // Layer `layer` of `job_id`'s hold at `step`. The key is checked first, in time that does
  // not depend on where it differs: PermissionDenied, the same answer whether or not the job
  // has a hold, when `key` does not open one (empty, wrong, or its hold ended or was
  // replaced), so a caller without the key learns nothing of what is held; with the key,
  // NotFound for another step or a layer it does not hold. The bytes stay valid while the
  // caller keeps the pointer, after the hold ends too.
  absl::StatusOr<std::shared_ptr<const std::string>> Layer(const std::string& job_id, int64_t step,
                                                           int layer, const std::string& key) const;
  // The coordinator's answer to a heartbeat sent at `sent`: the holds of jobs not in `jobs`
  // taken before then end (one taken after may be newer than what the answer knew).
  void KeepOnly(const std::vector<std::string>& jobs, absl::Time sent);

  // Bytes held now (holds whose time is up count until the next call drops them).
  int64_t bytes() const;
  // How many jobs it holds state of.
  int jobs() const;

 private:
  // A hold's layers, freed together (and the memory given back) when the last pointer to
  // any of them goes.
  struct Bytes {
    std::map<int, std::string> layers;
    ~Bytes();
  };
  struct Entry {
    int64_t step = 0;
    std::string key;
    absl::Time taken, until;
    std::shared_ptr<const Bytes> bytes;
    int64_t size = 0;
  };
  // REQUIRES: mu_ held.
  void DropExpired() const;

  const std::shared_ptr<const Clock> clock_;
  mutable std::mutex mu_;
  mutable std::map<std::string, Entry> holds_;  // by job
};

}  // namespace pipetrain::worker
