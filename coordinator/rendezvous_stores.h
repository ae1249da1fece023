// Where the ranks of running jobs meet: a key-value store per job, in memory
// (runtime/rendezvous), served by the KV RPCs of CoordinatorService to the workers that run
// one of the job's ranks. Each generation of a job starts with a new, empty store (its ranks
// meet afresh); a job that ends or recovers has none. Bounded: kValueBytes per value,
// kKeyBytes per key, kJobBytes per job.
//
// Not thread-safe: the coordinator uses it under its lock. The stores themselves are
// thread-safe and shared with the RPCs that serve them (shared_ptr): one closed here lives
// until the last call using it returns.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>

#include "runtime/rendezvous/key_value_store.h"

namespace pipetrain::coordinator {

class RendezvousStores {
 public:
  static constexpr size_t kValueBytes = size_t{1} << 20;
  static constexpr size_t kKeyBytes = 1024;
  static constexpr size_t kJobBytes = size_t{64} << 20;

  // A new, empty store for the job's generation that starts (replacing its last one).
  void Open(const std::string& job_id) {
    stores_[job_id] = rendezvous::MakeMemoryStore({kValueBytes, kJobBytes});
  }
  // The job ended or recovers: its ranks meet no more.
  void Close(const std::string& job_id) { stores_.erase(job_id); }
  // The job's store, or null when it has none.
  std::shared_ptr<rendezvous::KeyValueStore> Find(const std::string& job_id) const {
    auto it = stores_.find(job_id);
    return it == stores_.end() ? nullptr : it->second;
  }

 private:
  std::map<std::string, std::shared_ptr<rendezvous::KeyValueStore>> stores_;
};

}  // namespace pipetrain::coordinator
