#include "coordinator/worker_pool.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pipetrain::coordinator {

WorkerPool::Worker& WorkerPool::Add(v1::WorkerInfo info, std::shared_ptr<WorkerClient> client,
                                    std::string session, absl::Time now) {
  info.set_state(v1::WORKER_STATE_IDLE);
  info.set_job_id("");
  info.set_rank(-1);
  info.set_last_heartbeat_unix_ms(absl::ToUnixMillis(now));
  const std::string id = info.id();
  Worker& w = workers_[id];
  if (!w.session.empty()) by_session_.erase(w.session);
  if (!w.info.address().empty()) by_address_.erase(w.info.address());
  by_session_[session] = id;
  by_address_[info.address()] = id;
  w = Worker{std::move(info), now, std::move(client), std::move(session)};
  return w;
}

WorkerPool::Worker* WorkerPool::Find(const std::string& id) {
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : &it->second;
}

WorkerPool::Worker* WorkerPool::FindBySession(const std::string& session) {
  if (session.empty()) return nullptr;
  auto it = by_session_.find(session);
  return it == by_session_.end() ? nullptr : Find(it->second);
}

absl::StatusOr<WorkerPool::Worker*> WorkerPool::Heartbeat(const std::string& id, absl::Time now) {
  Worker* w = Find(id);
  if (w == nullptr || w->info.state() == v1::WORKER_STATE_LOST) {
    return absl::NotFoundError(absl::StrCat("unknown worker ", id, ": register again"));
  }
  w->last_heartbeat = now;
  w->info.set_last_heartbeat_unix_ms(absl::ToUnixMillis(now));
  return w;
}

WorkerPool::Worker* WorkerPool::FindByAddress(const std::string& address) {
  auto it = by_address_.find(address);
  return it == by_address_.end() ? nullptr : Find(it->second);
}

void WorkerPool::Remove(const std::string& id) {
  auto it = workers_.find(id);
  if (it == workers_.end()) return;
  by_session_.erase(it->second.session);
  auto address = by_address_.find(it->second.info.address());
  if (address != by_address_.end() && address->second == id) by_address_.erase(address);
  workers_.erase(it);
}

void WorkerPool::MarkLost(Worker& w, absl::Time now, const std::string& why) {
  Lost lost{w.info.id(),
            w.info.address(),
            w.info.job_id(),
            w.info.rank(),
            absl::ZeroDuration(),
            w.generation,
            why};
  if (w.info.state() != v1::WORKER_STATE_LOST) lost.silent = now - w.last_heartbeat;
  w.info.set_state(v1::WORKER_STATE_LOST);
  w.info.set_job_id("");
  w.info.set_rank(-1);
  w.lost_at = now;
  if (on_lost_) on_lost_(lost);
}

std::vector<std::string> WorkerPool::RemoveLostFor(absl::Time now, absl::Duration ttl) {
  std::vector<std::string> removed;
  for (const auto& [id, w] : workers_) {
    if (w.info.state() == v1::WORKER_STATE_LOST && now - w.lost_at > ttl) removed.push_back(id);
  }
  for (const std::string& id : removed) Remove(id);
  return removed;
}

std::vector<std::string> WorkerPool::IdleIds() const {
  std::vector<std::string> ids;
  for (const auto& [id, w] : workers_) {
    if (w.info.state() == v1::WORKER_STATE_IDLE) ids.push_back(id);
  }
  return ids;
}

void WorkerPool::Assign(Worker& w, const std::string& job_id, int rank, int generation) {
  w.generation = generation;
  w.info.set_state(v1::WORKER_STATE_BUSY);
  w.info.set_job_id(job_id);
  w.info.set_rank(rank);
}

void WorkerPool::MarkDraining(Worker& w) {
  if (w.info.state() != v1::WORKER_STATE_LOST) w.info.set_state(v1::WORKER_STATE_DRAINING);
}

void WorkerPool::Release(Worker& w) {
  if (w.info.state() == v1::WORKER_STATE_LOST) return;
  if (w.info.state() != v1::WORKER_STATE_DRAINING) w.info.set_state(v1::WORKER_STATE_IDLE);
  w.info.set_job_id("");
  w.info.set_rank(-1);
}

int WorkerPool::ExpireSilent(absl::Time now, absl::Duration limit) {
  std::vector<Worker*> silent;
  for (auto& [id, w] : workers_) {
    if (w.info.state() != v1::WORKER_STATE_LOST && now - w.last_heartbeat > limit) {
      silent.push_back(&w);
    }
  }
  for (Worker* w : silent) {
    const std::string none_for =
        absl::FormatDuration(absl::Trunc(now - w->last_heartbeat, absl::Milliseconds(1)));
    MarkLost(*w, now, absl::StrCat("stopped sending heartbeats (none for ", none_for, ")"));
  }
  return static_cast<int>(silent.size());
}

int WorkerPool::ExcuseSilence(absl::Duration stalled, absl::Time now) {
  int live = 0;
  for (auto& [id, w] : workers_) {
    if (w.info.state() == v1::WORKER_STATE_LOST) continue;
    ++live;
    w.last_heartbeat = std::min(now, w.last_heartbeat + stalled);
  }
  return live;
}

absl::Time WorkerPool::NextExpiry(absl::Duration limit) const {
  absl::Time next = absl::InfiniteFuture();
  for (const auto& [id, w] : workers_) {
    if (w.info.state() != v1::WORKER_STATE_LOST) next = std::min(next, w.last_heartbeat + limit);
  }
  return next;
}

std::vector<v1::WorkerInfo> WorkerPool::Infos() const {
  std::vector<v1::WorkerInfo> out;
  for (const auto& [id, w] : workers_) out.push_back(w.info);
  return out;
}

std::vector<PoolWorker> WorkerPool::Placeable() const {
  std::vector<PoolWorker> out;
  out.reserve(workers_.size());
  for (const auto& [id, w] : workers_) {
    if (w.info.state() != v1::WORKER_STATE_LOST) out.push_back(PoolWorkerOf(w.info));
  }
  return out;
}

}  // namespace pipetrain::coordinator
