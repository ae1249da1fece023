// The survivors' state a worker holds. See held_state.h.
#include "worker/held_state.h"

#include <malloc.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pipetrain::worker {

namespace {

// Whether `a` equals `b`, in time that depends on their lengths only.
bool SameKey(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ |= static_cast<unsigned char>(a[i] ^ b[i]);
  return differ == 0;
}

}  // namespace

HeldStates::Bytes::~Bytes() {
  layers.clear();
  // Blocks below 32 MiB come from the heap, which keeps up to 64 MiB free (allocator.h):
  // without this, a hold's memory stayed with the process after it ended.
  malloc_trim(0);
}

void HeldStates::Hold(const std::string& job_id, int64_t step, const std::string& key,
                      absl::Duration hold_for, std::map<int, std::string> layers) {
  Entry entry;
  entry.step = step;
  entry.key = key;
  entry.taken = clock_->Now();
  entry.until = entry.taken + hold_for;
  auto bytes = std::make_shared<Bytes>();
  for (const auto& [layer, state] : layers) entry.size += static_cast<int64_t>(state.size());
  bytes->layers = std::move(layers);
  entry.bytes = std::move(bytes);
  std::shared_ptr<const Bytes> replaced;  // freed outside the lock
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = holds_.find(job_id); it != holds_.end()) replaced = it->second.bytes;
    holds_[job_id] = std::move(entry);
    DropExpired();
  }
}

absl::StatusOr<std::shared_ptr<const std::string>> HeldStates::Layer(const std::string& job_id,
                                                                     int64_t step, int layer,
                                                                     const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  DropExpired();
  auto it = holds_.find(job_id);
  // The key first, the same answer for a job without a hold: nothing is learnt without it.
  if (key.empty() || it == holds_.end() || !SameKey(key, it->second.key)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "no state of ", job_id, " is held for this key (a wrong key, or the hold ended)"));
  }
  if (it->second.step != step) {
    return absl::NotFoundError(absl::StrCat("this worker holds the state of ", job_id, " at step ",
                                            it->second.step, ", not ", step));
  }
  const std::shared_ptr<const Bytes>& bytes = it->second.bytes;
  auto layer_it = bytes->layers.find(layer);
  if (layer_it == bytes->layers.end()) {
    return absl::NotFoundError(absl::StrCat("this worker holds no layer ", layer, " of ", job_id));
  }
  // Shares the hold's ownership: the bytes outlive the hold while a fetch serves them.
  return std::shared_ptr<const std::string>(bytes, &layer_it->second);
}

void HeldStates::KeepOnly(const std::vector<std::string>& jobs, absl::Time sent) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = holds_.begin(); it != holds_.end();) {
    const bool named = std::find(jobs.begin(), jobs.end(), it->first) != jobs.end();
    it = !named && it->second.taken < sent ? holds_.erase(it) : std::next(it);
  }
  DropExpired();
}

int64_t HeldStates::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t total = 0;
  for (const auto& [job, entry] : holds_) total += entry.size;
  return total;
}

int HeldStates::jobs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(holds_.size());
}

void HeldStates::DropExpired() const {
  const absl::Time now = clock_->Now();
  for (auto it = holds_.begin(); it != holds_.end();) {
    it = it->second.until <= now ? holds_.erase(it) : std::next(it);
  }
}

}  // namespace pipetrain::worker
