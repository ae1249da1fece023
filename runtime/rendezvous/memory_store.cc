// KeyValueStore in this process's memory: what the coordinator serves to a job's ranks over
// its KV RPCs.
#include <condition_variable>
#include <map>
#include <mutex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/rendezvous/key_value_store.h"

namespace pipetrain::rendezvous {
namespace {

class MemoryStore : public KeyValueStore {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override {
    std::lock_guard<std::mutex> lock(mu_);
    values_[key] = value;
    changed_.notify_all();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout));
    if (!changed_.wait_until(lock, until, [&] { return values_.count(key) > 0; })) {
      return absl::DeadlineExceededError(absl::StrCat(
          "store: '", key, "' was not set within ", absl::FormatDuration(timeout)));
    }
    return values_[key];
  }
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t value = 0;
    auto it = values_.find(key);
    if (it != values_.end() && !absl::SimpleAtoi(it->second, &value)) {
      return absl::FailedPreconditionError(
          absl::StrCat("store: add to '", key, "', which holds no integer"));
    }
    value += delta;
    values_[key] = absl::StrCat(value);
    changed_.notify_all();
    return value;
  }
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (const std::string& k : keys) {
      if (!values_.count(k)) return false;
    }
    return true;
  }
  absl::Status Delete(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    values_.erase(key);
    return absl::OkStatus();
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, std::string> values_;
};

}  // namespace

std::unique_ptr<KeyValueStore> MakeMemoryStore() { return std::make_unique<MemoryStore>(); }

}  // namespace pipetrain::rendezvous
