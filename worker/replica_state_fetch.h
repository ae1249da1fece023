// A rank's state taken from the survivors of a fault, as their workers hold it
// (StageAssignment.replica_state, held_state.h): each of its layers from its own worker's hold
// if that has it, else fetched from one of the layer's holders (WorkerService.FetchLayerState
// over gRPC, with the hold's key; a holder serves a few fetches at once and refuses more,
// RESOURCE_EXHAUSTED: then the holders are asked again after a growing pause, until the
// deadline). No checkpoint is read. A rank that cannot get every layer
// gets an error naming the first layer no holder gave, with each holder's answer (the host
// then reads the checkpoint instead: job::StageRunOptions::replica_state).
//
// Thread-compatible: one call per rank, on the stage's thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "pipetrain/v1/worker_service.pb.h"
#include "rpc/security.h"
#include "runtime/checkpoint/layer_state.h"
#include "runtime/model/partition.h"
#include "worker/held_state.h"

namespace pipetrain::worker {

// What one rank's fetch came to.
struct ReplicaStateFetch {
  int held_here = 0;                 // layers its own worker held
  int fetched = 0;                   // layers fetched from other workers ...
  int64_t bytes_fetched = 0;         // ... their bytes
  std::vector<std::string> sources;  // ... and the workers they came from (each once)
  absl::Duration took;

  // "2 layers held here, 2 fetched from 10.0.0.2:4711 (1.2 MiB) in 14 ms".
  std::string Describe() const;
};

struct ReplicaStateSource {
  std::string job_id;
  std::string own_address;            // this worker's WorkerService address (never called)
  const HeldStates* local = nullptr;  // this worker's holds (not owned; outlives the call)
  rpc::SecurityOptions security;      // as this worker's calls to its coordinator
  // Which of a layer's holders is asked first (the rank's replica): the ranks of a place
  // spread over them.
  int spread = 0;
  absl::Duration timeout = absl::Seconds(30);  // for the whole fetch
};

// The state of `layers` (in order, layer by layer) at `state.step()`.
absl::StatusOr<std::vector<checkpoint::LayerState>> FetchReplicaState(
    const v1::ReplicaState& state, const std::vector<model::LayerRange>& layers,
    const ReplicaStateSource& source, ReplicaStateFetch* report);

}  // namespace pipetrain::worker
