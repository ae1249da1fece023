// Internal: the c10d::Store behind a KeyValueStore, for building c10d process groups.
// TCP stores made by this folder have one of their own; any other store is adapted.
#pragma once

#include <memory>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/time/time.h"

#include "runtime/rendezvous/key_value_store.h"

namespace pipetrain::rendezvous {

class C10dStoreHolder {
 public:
  virtual ~C10dStoreHolder() = default;
  virtual c10::intrusive_ptr<c10d::Store> c10d_store() const = 0;
};

// The c10d store of `store`, or null if it has none.
inline c10::intrusive_ptr<c10d::Store> C10dStoreOf(const KeyValueStore& store) {
  const auto* holder = dynamic_cast<const C10dStoreHolder*>(&store);
  return holder ? holder->c10d_store() : c10::intrusive_ptr<c10d::Store>();
}

// The store's own c10d store, or an adapter that forwards to `store` (its get() and wait()
// time out after `timeout`).
c10::intrusive_ptr<c10d::Store> AsC10dStore(std::shared_ptr<KeyValueStore> store,
                                            absl::Duration timeout);

}  // namespace pipetrain::rendezvous
