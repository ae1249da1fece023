// Where a job's Gloo ranks listen (published in the job's store before they connect), and
// what a rank's failure to connect says of its peers, so that the error names the peer and
// the address it could not reach. No LibTorch, no Gloo. Thread-safe as the store is.
#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "runtime/rendezvous/key_value_store.h"

namespace pipetrain::transport {

// Publishes `host` as where rank `rank` listens.
absl::Status PublishListenAddress(rendezvous::KeyValueStore& store, int rank,
                                  const std::string& host);

// What a failure of rank `rank` (of `world`) to connect, saying `error`, says of its peers:
// the one it could not reach, at its address, when the error names that address or there is
// only one peer; else every peer's address; "" if none was published. The addresses were
// published before the rendezvous, so reading them does not wait (100 ms a peer at most).
// `describe(r)` names rank r ("rank 1 (stage 1, replica 0)").
std::string PeersNamed(rendezvous::KeyValueStore& store, const std::string& error, int rank,
                       int world, const std::function<std::string(int)>& describe);

}  // namespace pipetrain::transport
