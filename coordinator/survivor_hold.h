// What the survivors of a job's last round hold in their workers' memory for its next
// generation: once a round (survivor_round.h) decides to go on from step N, the ranks that
// stand at N keep their layers' state (under a key) until the job has committed step N
// again or ended, and a generation starting at N takes it from them instead of reading the
// checkpoint (StageAssignment.replica_state), running each stage on its holders where it can.
//
// Pure: no clock, no I/O; the coordinator looks up where a worker is and whether it is lost
// (the `live_address` argument). Thread-compatible (the coordinator holds its lock).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/survivor_round.h"
#include "pipetrain/v1/worker_service.pb.h"

namespace pipetrain::coordinator {

struct SurvivorHold {
  int64_t step = 0;
  std::string key;                                        // the holds' (rpc::RandomKey)
  std::map<int, std::vector<std::string>> layer_workers;  // each layer's holders
  int stages = 0;                                         // of the generation the survivors ran
  std::map<std::string, int> worker_stages;               // the stage each holder ran

  // What the survivors of `round` (decided, with a plan) hold: rank r ran on rank_workers[r],
  // `stages` ranks a pipeline.
  static SurvivorHold FromRound(const SurvivorRound& round,
                                const std::vector<std::string>& rank_workers, int stages,
                                std::string key);

  // Whether worker `worker_id` holds some layer of it.
  bool HeldBy(const std::string& worker_id) const;
  // Still needed: the job has committed every step before `step` only (its last committed
  // step is `committed_step`); once it committed `step` again the next generation holds it.
  bool NeededAfter(int64_t committed_step) const { return committed_step < step; }

  // The replica state a generation starting at `start_step` takes: each layer with the
  // addresses of its holders still there (`live_address`: a worker's address, "" when it is
  // lost or unknown). Empty (no layer) when the hold is not for `start_step`, or when some
  // layer has no holder left: that layer in `missing_layer`, and the generation reads the
  // checkpoint instead.
  struct ForGeneration {
    v1::ReplicaState state;
    std::optional<int> missing_layer;
  };
  ForGeneration StateFor(int64_t start_step,
                         const std::function<std::string(const std::string&)>& live_address) const;

  // Each holder's place among its stage's holders (0 first): placing the workers in this order
  // lets a smaller layout keep as many holders of each stage as it can.
  std::map<std::string, int> HolderTurns() const;
};

}  // namespace pipetrain::coordinator
