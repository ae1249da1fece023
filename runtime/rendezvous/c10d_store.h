// Internal: the c10d::Store behind a KeyValueStore, for building c10d process groups.
// Only stores made by this folder have one.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

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

}  // namespace pipetrain::rendezvous
