// The data plane's rendezvous as a worker sees it: a KeyValueStore whose every operation is
// a KV RPC to the coordinator for one job (CoordinatorService.KvSet, ...), over the
// worker's own channel (with its token and TLS). Get waits in slices of at most 5 s, each a
// KvGet that the coordinator holds until the key is set, until its timeout. Every call has a
// deadline. Each call names the generation of the rank that makes it: once that generation
// has ended the coordinator refuses it (FailedPrecondition), so that a rank of an ended
// generation can neither meet the next one's ranks nor count in its checkpoint. Thread-safe.
#pragma once

#include <memory>
#include <string>

#include "pipetrain/v1/coordinator_service.grpc.pb.h"
#include "runtime/rendezvous/key_value_store.h"

namespace pipetrain::worker {

std::shared_ptr<rendezvous::KeyValueStore> MakeCoordinatorStore(
    std::shared_ptr<v1::CoordinatorService::Stub> coordinator, std::string job_id, int generation);

}  // namespace pipetrain::worker
