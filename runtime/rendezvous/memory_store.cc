// KeyValueStore in this process's memory: what the coordinator serves to a job's ranks over
// its KV RPCs.
#include <condition_variable>
#include <map>
#include <mutex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/status_macros.h"
#include "runtime/rendezvous/key_value_store.h"

namespace pipetrain::rendezvous {
namespace {

class MemoryStore : public KeyValueStore {
 public:
  explicit MemoryStore(MemoryStoreLimits limits) : limits_(limits) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    std::lock_guard<std::mutex> lock(mu_);
    PT_RETURN_IF_ERROR(Put(key, value));
    changed_.notify_all();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout));
    if (!changed_.wait_until(lock, until, [&] { return values_.count(key) > 0; })) {
      return absl::DeadlineExceededError(
          absl::StrCat("store: '", key, "' was not set within ", absl::FormatDuration(timeout)));
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
    if (__builtin_add_overflow(value, delta, &value)) {
      return absl::OutOfRangeError(
          absl::StrCat("store: add ", delta, " to '", key, "' overflows a 64-bit integer"));
    }
    PT_RETURN_IF_ERROR(Put(key, absl::StrCat(value)));
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
    auto it = values_.find(key);
    if (it != values_.end()) {
      total_bytes_ -= it->first.size() + it->second.size();
      values_.erase(it);
    }
    return absl::OkStatus();
  }

 private:
  // Sets `key` within the limits (mu_ held).
  absl::Status Put(const std::string& key, const std::string& value) {
    if (value.size() > limits_.max_value_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("store: a value of ", value.size(), " bytes for '", key.substr(0, 64),
                       "' exceeds the limit of ", limits_.max_value_bytes, " bytes"));
    }
    auto it = values_.find(key);
    const size_t old = it == values_.end() ? 0 : key.size() + it->second.size();
    const size_t total = total_bytes_ - old + key.size() + value.size();
    if (total > limits_.max_total_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("store: setting '", key.substr(0, 64), "' would hold ", total,
                       " bytes, over the limit of ", limits_.max_total_bytes, " bytes"));
    }
    values_[key] = value;
    total_bytes_ = total;
    return absl::OkStatus();
  }

  const MemoryStoreLimits limits_;
  size_t total_bytes_ = 0;
  std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, std::string> values_;
};

}  // namespace

std::unique_ptr<KeyValueStore> MakeMemoryStore(MemoryStoreLimits limits) {
  return std::make_unique<MemoryStore>(limits);
}

}  // namespace pipetrain::rendezvous
