// The small key-value store that bootstraps the data plane: processes meet there, exchange
// addresses and report progress. A TCP store (one process serves, the others connect: the
// stage processes of `pipetrain run --launch processes`), or the coordinator's KV RPCs (a
// memory store there, a gRPC client in the worker).
//
// Every wait has a deadline. Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pipetrain::rendezvous {

class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  // Returns once the value is in the store, seen by every later Get or Check from anyone
  // (also after this process exits).
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // Waits until `key` is set, at most `timeout` (DeadlineExceeded naming the key).
  virtual absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) = 0;
  // Atomically adds `delta` to the integer at `key` (0 if unset); returns the new value.
  virtual absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) = 0;
  // True if every key is set; does not wait.
  virtual absl::StatusOr<bool> Check(const std::vector<std::string>& keys) = 0;
  virtual absl::Status Delete(const std::string& key) = 0;
  // Its user is stopping: every wait in progress and every later call ends at once with
  // `why`. A store that cannot do so (the default) ignores it; its waits end at their
  // deadlines.
  virtual void Abort(const absl::Status& why) { (void)why; }
};

// Serves a store on host:port (port 0: any free port) and is a client of it.
absl::StatusOr<std::unique_ptr<KeyValueStore>> ServeTcpStore(const std::string& host, int port);
// What a store in memory holds at most: each value, and all keys and values together. A Set
// beyond either is ResourceExhausted and changes nothing.
struct MemoryStoreLimits {
  size_t max_value_bytes = SIZE_MAX;
  size_t max_total_bytes = SIZE_MAX;
};
// A store in this process's memory (no c10d store of its own; see c10d_store.h). Add that
// would overflow int64 is OutOfRange and changes nothing.
std::unique_ptr<KeyValueStore> MakeMemoryStore(MemoryStoreLimits limits = {});
// Connects to a served store, retrying until `timeout`. First it asks the address a store's
// query, so that a server of another kind there fails at once: FailedPrecondition naming the
// address and what answered ("it speaks HTTP/2 (a gRPC server ...)"), or that it answered
// nothing within 5 s; Unavailable if nothing accepts connections there by the deadline.
absl::StatusOr<std::unique_ptr<KeyValueStore>> ConnectTcpStore(const std::string& host, int port,
                                                               absl::Duration timeout);
// The port a store made by ServeTcpStore listens on; -1 for other stores.
int TcpStorePort(const KeyValueStore& store);

// Every one of `world` ranks announces itself under `prefix` and waits for all others. On
// the deadline: DeadlineExceeded naming every rank that did not arrive, described by
// `describe(rank)` (e.g. "rank 3 (stage 1, replica 1)").
absl::Status Rendezvous(KeyValueStore& store, const std::string& prefix, int rank, int world,
                        absl::Duration timeout,
                        const std::function<std::string(int rank)>& describe);

}  // namespace pipetrain::rendezvous
