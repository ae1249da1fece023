// The survivors' state a worker holds. See held_state.h.
#include "worker/held_state.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pipetrain::worker {

void HeldStates::Hold(const std::string& job_id, int64_t step, const std::string& key,
                      absl::Duration hold_for, std::map<int, std::string> layers) {
  Entry entry;
  entry.step = step;
  entry.key = key;
  entry.taken = clock_->Now();
  entry.until = entry.taken + hold_for;
  for (auto& [layer, bytes] : layers) {
    entry.bytes += static_cast<int64_t>(bytes.size());
    entry.layers[layer] = std::make_shared<const std::string>(std::move(bytes));
  }
  std::lock_guard<std::mutex> lock(mu_);
  holds_[job_id] = std::move(entry);
  DropExpired();
}

absl::StatusOr<std::shared_ptr<const std::string>> HeldStates::Layer(
    const std::string& job_id, int64_t step, int layer, const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  DropExpired();
  auto it = holds_.find(job_id);
  if (it == holds_.end() || it->second.step != step) {
    return absl::NotFoundError(
        absl::StrCat("this worker holds no state of ", job_id, " at step ", step));
  }
  // The key is checked before saying whether the layer is here.
  if (key.empty() || key != it->second.key) {
    return absl::PermissionDeniedError(
        absl::StrCat("the state of ", job_id, " is served only with its key"));
  }
  auto layer_it = it->second.layers.find(layer);
  if (layer_it == it->second.layers.end()) {
    return absl::NotFoundError(absl::StrCat("this worker holds no layer ", layer, " of ", job_id));
  }
  return layer_it->second;
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
  for (const auto& [job, entry] : holds_) total += entry.bytes;
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
