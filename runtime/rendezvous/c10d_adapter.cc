// A c10d::Store over any KeyValueStore, so that c10d process groups (transport/gloo) can
// meet through stores that are not c10d's own, such as the coordinator's KV RPCs.
#include <chrono>
#include <stdexcept>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/rendezvous/c10d_store.h"

namespace pipetrain::rendezvous {
namespace {

absl::Duration FromChrono(std::chrono::milliseconds ms) { return absl::Milliseconds(ms.count()); }

template <typename T>
T OrThrow(absl::StatusOr<T> result) {
  if (!result.ok()) throw std::runtime_error(std::string(result.status().message()));
  return *std::move(result);
}

void OrThrow(const absl::Status& status) {
  if (!status.ok()) throw std::runtime_error(std::string(status.message()));
}

class KeyValueC10dStore : public c10d::Store {
 public:
  KeyValueC10dStore(std::shared_ptr<KeyValueStore> store, std::chrono::milliseconds timeout)
      : c10d::Store(timeout), store_(std::move(store)) {}

  // A copy for another thread: LibTorch 2.x declares it (pure virtual; 1.13 has no such
  // member, hence no `override`). The key-value store is thread-safe, so the copy shares it.
  c10::intrusive_ptr<c10d::Store> clone() {
    return c10::make_intrusive<KeyValueC10dStore>(store_, timeout_);
  }
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    OrThrow(store_->Set(key, std::string(value.begin(), value.end())));
  }
  std::vector<uint8_t> get(const std::string& key) override {
    const std::string v = OrThrow(store_->Get(key, FromChrono(timeout_)));
    return std::vector<uint8_t>(v.begin(), v.end());
  }
  int64_t add(const std::string& key, int64_t value) override {
    return OrThrow(store_->Add(key, value));
  }
  bool deleteKey(const std::string& key) override {
    OrThrow(store_->Delete(key));
    return true;
  }
  bool check(const std::vector<std::string>& keys) override { return OrThrow(store_->Check(keys)); }
  int64_t getNumKeys() override {
    throw std::runtime_error("getNumKeys is not supported by pipetrain's stores");
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!check(keys)) {
      if (std::chrono::steady_clock::now() >= deadline) {
        throw std::runtime_error(absl::StrCat("store: wait for ", keys.size(),
                                              " keys timed out after ", timeout.count(), " ms"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

 private:
  std::shared_ptr<KeyValueStore> store_;
};

}  // namespace

c10::intrusive_ptr<c10d::Store> AsC10dStore(std::shared_ptr<KeyValueStore> store,
                                            absl::Duration timeout) {
  if (auto own = C10dStoreOf(*store)) return own;
  return c10::make_intrusive<KeyValueC10dStore>(
      std::move(store), std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
}

}  // namespace pipetrain::rendezvous
