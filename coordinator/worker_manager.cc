// The coordinator's side of its workers. See worker_manager.h.
#include "coordinator/worker_manager.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "jobspec/step_commands.h"
#include "proto/states.h"
#include "rpc/security.h"
#include "runtime/base/host_port.h"
#include "runtime/base/status_macros.h"

namespace pipetrain::coordinator {

namespace {

// "host:port", "[v6]:port": a host of letters, digits, '.', '-', '_' (or an IPv6 address in
// brackets) and a port in 1..65535. What a channel is made to, so nothing else is taken.
bool IsServiceAddress(const std::string& address) {
  const absl::StatusOr<HostPort> parsed = ParseHostPort(address, 1);
  if (!parsed.ok() || parsed->host.empty()) return false;
  const std::string& host = parsed->host;
  if (address.front() == '[') {
    return std::all_of(host.begin(), host.end(), [](char c) {
      return absl::ascii_isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.';
    });
  }
  return std::all_of(host.begin(), host.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_';
  });
}

// The host a call came from, as gRPC names its peer ("ipv4:10.0.0.2:5555",
// "ipv6:[fd00::2]:5555"); "" for a local socket or an unknown peer.
std::string PeerHost(const std::string& peer) {
  for (const char* scheme : {"ipv4:", "ipv6:"}) {
    if (absl::StartsWith(peer, scheme)) return HostOf(peer.substr(std::strlen(scheme)));
  }
  return "";
}

}  // namespace

WorkerManager::WorkerManager(CoordinatorState& state, Dispatcher& dispatcher,
                             WorkerConnector connect)
    : state_(state), dispatcher_(dispatcher), connect_(std::move(connect)) {
  absl::MutexLock lock(&state_.mu);
  state_.pool.SetLostListener([this](const WorkerPool::Lost& lost) {
    state_.mu.AssertHeld();  // the pool is only used under the lock
    OnWorkerLost(lost);
  });
}

std::vector<v1::WorkerInfo> WorkerManager::Workers() {
  absl::MutexLock lock(&state_.mu);
  return state_.pool.Infos();
}

int64_t WorkerManager::lost_silent() const {
  state_.mu.AssertHeld();
  return workers_lost_silent_;
}

void WorkerManager::CoordinatorStalled(absl::Duration stalled) {
  state_.mu.AssertHeld();
  if (stalled <= absl::ZeroDuration()) return;
  ++stalls_excused_;
  const int excused = state_.pool.ExcuseSilence(stalled, state_.clock->Now());
  std::fprintf(stderr,
               "coordinator: this process did not run for %s (stopped, swapped out or starved "
               "of CPU): the silence of %d worker(s) in that time is not counted against them\n",
               absl::FormatDuration(absl::Trunc(stalled, absl::Milliseconds(1))).c_str(), excused);
}

int64_t WorkerManager::stalls_excused() const {
  state_.mu.AssertHeld();
  return stalls_excused_;
}

void WorkerManager::Tick() {
  state_.mu.AssertHeld();
  const absl::Time now = state_.clock->Now();
  for (const std::string& id : state_.pool.RemoveLostFor(now, state_.options.lost_worker_ttl)) {
    std::fprintf(stderr, "coordinator: %s forgotten (lost for over %s)\n", id.c_str(),
                 absl::FormatDuration(state_.options.lost_worker_ttl).c_str());
  }
  workers_lost_silent_ += state_.pool.ExpireSilent(now, 2 * state_.options.heartbeat_interval);
}

absl::StatusOr<v1::RegisterWorkerResponse> WorkerManager::Register(
    const v1::RegisterWorkerRequest& request, const std::string& peer) {
  if (request.address().empty()) {
    return absl::InvalidArgumentError("address: the worker's service address is required");
  }
  if (request.address().size() > 256 || request.device().size() > 64 ||
      request.name().size() > 256 || request.memory_bytes() < 0 || request.cores() < 0 ||
      request.cores() > kMaxWorkerCores) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a worker's address and name are at most 256 bytes, its device 64, its memory >= 0, "
        "its cores in [0, ",
        kMaxWorkerCores, "]"));
  }
  if (request.host().size() > 255 ||
      std::any_of(request.host().begin(), request.host().end(), [](char ch) {
        return static_cast<unsigned char>(ch) < 0x21 || static_cast<unsigned char>(ch) > 0x7e;
      })) {
    return absl::InvalidArgumentError(
        "host: the worker's machine is named by at most 255 printable ASCII characters, no "
        "spaces (--host-name)");
  }
  if (!IsServiceAddress(request.address())) {
    return absl::InvalidArgumentError(
        "address: expected the worker's service as host:port (a name, an IPv4 address or "
        "[IPv6]) with a port in 1..65535");
  }
  // An address nobody else can reach is refused, naming the flag that fixes it.
  const std::string host = HostOf(request.address());
  if (host == "0.0.0.0" || host == "::") {
    return absl::InvalidArgumentError(absl::StrCat(
        "address ", request.address(),
        " is a wildcard, not an address the coordinator or "
        "the worker's peers can reach: start the worker with --advertise-address ADDR or "
        "--iface NAME"));
  }
  if (const std::string from = PeerHost(peer);
      IsLoopbackHost(host) && !from.empty() && !IsLoopbackHost(from)) {
    return absl::FailedPreconditionError(
        absl::StrCat("address ", request.address(),
                     " is a loopback address, but the worker registered "
                     "from ",
                     from,
                     ": the coordinator and workers on other hosts cannot reach it there; "
                     "start the worker with --advertise-address ADDR or --iface NAME"));
  }
  if (request.command_key().size() != 32 ||
      request.command_key().find_first_not_of("0123456789abcdef") != std::string::npos) {
    return absl::InvalidArgumentError(
        "command_key: a worker registers with a random key of 32 lowercase hex digits");
  }
  // An address a worker still holds is taken over only once that worker is gone from it: a
  // worker restarted on its port (the old process no longer answers with its key) or after
  // the old one was lost. A caller that merely holds the join token cannot take a working
  // worker's place (and so fail its job).
  std::shared_ptr<WorkerClient> holder;
  std::string holder_id;
  {
    absl::MutexLock lock(&state_.mu);
    if (WorkerPool::Worker* old = state_.pool.FindByAddress(request.address());
        old != nullptr && old->info.state() != v1::WORKER_STATE_LOST) {
      holder = old->client;
      holder_id = old->info.id();
    }
  }
  if (holder != nullptr && holder->Ping().ok()) {
    return absl::AlreadyExistsError(absl::StrCat(
        "address ", request.address(), " is held by ", holder_id,
        ", which still answers there with its own key; a worker restarted on that address "
        "takes it over once the old one no longer answers (or is lost)"));
  }
  absl::StatusOr<std::shared_ptr<WorkerClient>> client =
      connect_(request.address(), request.command_key());
  if (!client.ok()) return client.status();
  // Numbered in the store: a worker still known by its id from before a restart must not
  // find that id given to another (its heartbeats would pass for the other's).
  absl::StatusOr<int64_t> number = NextWorkerNumber();
  if (!number.ok()) {
    std::fprintf(stderr, "coordinator: %s\n", std::string(number.status().message()).c_str());
  }
  StateLock lock(&state_);
  if (WorkerPool::Worker* old = state_.pool.FindByAddress(request.address())) {
    // The same service address again, where the old worker no longer answers: it restarted
    // (on a fixed port). One that registered meanwhile and was not asked is refused.
    const std::string old_id = old->info.id();
    if (old->info.state() != v1::WORKER_STATE_LOST && old_id != holder_id) {
      return absl::AbortedError(absl::StrCat("address ", request.address(), " was just taken by ",
                                             old_id, "; try again"));
    }
    if (old->info.state() != v1::WORKER_STATE_LOST) {
      state_.pool.MarkLost(*old, state_.clock->Now(),
                           "registered again: it restarted (the old process no longer answers)");
    }
    state_.pool.Remove(old_id);
  }
  next_worker_ = std::max(next_worker_ + 1, number.ok() ? *number : int64_t{0});
  v1::WorkerInfo info;
  info.set_id(absl::StrFormat("worker-%d", next_worker_));
  info.set_address(request.address());
  info.set_device(request.device().empty() ? "cpu" : request.device());
  info.set_memory_bytes(request.memory_bytes());
  info.set_cores(request.cores());
  info.set_host(request.host());
  const std::string session = rpc::RandomKey();
  state_.pool.Add(info, *client, session, state_.clock->Now());
  v1::RegisterWorkerResponse response;
  response.set_worker_id(info.id());
  response.set_session(session);
  response.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(state_.options.heartbeat_interval));
  response.set_lease_ms(
      absl::ToInt64Milliseconds(kLeaseIntervals * state_.options.heartbeat_interval));
  std::fprintf(stderr, "coordinator: %s registered (%s, %s%s%s)\n", info.id().c_str(),
               request.address().c_str(), info.device().c_str(), request.name().empty() ? "" : ", ",
               request.name().c_str());
  dispatcher_.Schedule();
  return response;
}

absl::StatusOr<int64_t> WorkerManager::NextWorkerNumber() {
  absl::MutexLock lock(&numbers_mu_);
  if (number_next_ > number_end_) {
    PT_ASSIGN_OR_RETURN(number_end_, state_.store->Increment("worker", kWorkerNumberBlock));
    number_next_ = number_end_ - kWorkerNumberBlock + 1;
  }
  return number_next_++;
}

absl::Status WorkerManager::Deregister(const std::string& session,
                                       const v1::DeregisterWorkerRequest& request) {
  StateLock lock(&state_);
  PT_ASSIGN_OR_RETURN(WorkerPool::Worker * w, state_.Caller(session, request.worker_id()));
  const std::string id = w->info.id();
  if (!w->info.job_id().empty())
    state_.pool.MarkLost(*w, state_.clock->Now(), "stopped (it was shut down)");
  std::fprintf(stderr, "coordinator: %s left (deregistered)\n", id.c_str());
  state_.pool.Remove(id);
  dispatcher_.Schedule();
  return absl::OkStatus();
}

absl::Status WorkerManager::Heartbeat(const std::string& session,
                                      const v1::HeartbeatRequest& request,
                                      v1::HeartbeatResponse* response) {
  absl::MutexLock lock(&state_.mu);
  absl::StatusOr<WorkerPool::Worker*> caller = state_.Caller(session, request.worker_id());
  if (!caller.ok()) return caller.status();
  if (request.action().size() > 64 || request.waiting_for().size() > 64) {
    return absl::InvalidArgumentError("action and waiting_for are at most 64 bytes");
  }
  absl::StatusOr<WorkerPool::Worker*> worker =
      state_.pool.Heartbeat((*caller)->info.id(), state_.clock->Now());
  if (!worker.ok()) return worker.status();
  if (response != nullptr) {
    for (std::string& job : HeldStateJobsOf((*worker)->info.id())) {
      response->add_held_state_jobs(std::move(job));
    }
  }
  if (request.job_id().empty()) return absl::OkStatus();
  auto j = state_.jobs.find(request.job_id());
  JobController* c = j == state_.jobs.end() ? nullptr : &j->second.controller;
  const bool rank_known = c != nullptr && request.rank() >= 0 &&
                          request.rank() < static_cast<int>(c->run().rank_ended.size());
  const bool stale =
      c != nullptr && request.generation() != 0 && request.generation() != c->job().generation();
  if (c == nullptr || stale ||
      (c->job().state() != v1::JOB_STATE_RUNNING &&
       !(rank_known && c->run().rank_ended[request.rank()]))) {
    // Its stage outlived its job (a stop that reached the worker before the assignment,
    // a job ended while it was unreachable): stop it again, or it would hold the worker.
    std::shared_ptr<WorkerClient> client = (*worker)->client;
    v1::StopStageRequest stop;
    stop.set_job_id(request.job_id());
    stop.set_generation(request.generation());
    stop.set_reason(stale ? absl::StrCat("generation ", request.generation(), " of job ",
                                         request.job_id(), " has ended")
                          : absl::StrCat("job ", request.job_id(), " is no longer running"));
    state_.Later([client, stop] { (void)client->StopStage(stop); });
  }
  // Its stage's activity, only for the rank it runs.
  if (c != nullptr && !stale &&
      c->Activity(request.rank(), (*worker)->info.id(), request.action(), request.waiting_for())) {
    ++j->second.version;
    state_.changed.SignalAll();
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::DrainWorkerResponse> WorkerManager::DrainWorker(
    const std::string& session, const v1::DrainWorkerRequest& request) {
  v1::DrainWorkerResponse response;
  std::shared_ptr<WorkerClient> rank0;
  std::string worker_id;
  {
    absl::MutexLock lock(&state_.mu);
    PT_ASSIGN_OR_RETURN(WorkerPool::Worker * w, state_.Caller(session, request.worker_id()));
    state_.pool.MarkDraining(*w);
    worker_id = w->info.id();
    auto j = state_.jobs.find(w->info.job_id());
    if (j == state_.jobs.end()) return response;
    const JobController& c = j->second.controller;
    response.set_job_id(c.id());
    if (c.job().restarts() >= c.config().max_restarts() || w->generation != c.job().generation()) {
      return response;  // nothing to restart: its rank ends with it
    }
    absl::StatusOr<std::shared_ptr<WorkerClient>> first =
        CommandRelay::Rank0(c.job(), c.phase(), c.rank_worker(), state_.pool);
    if (absl::IsFailedPrecondition(first.status())) return response;  // not running, recovering
    if (c.drain_step() > 0) {  // another worker's drain already asked for one
      response.set_checkpoint_step(c.drain_step());
      return response;
    }
    if (!first.ok()) return response;  // rank 0's worker is gone: no checkpoint to wait for
    rank0 = *std::move(first);
  }
  absl::StatusOr<int64_t> scheduled =
      CommandRelay::Send(*rank0, response.job_id(), v1::STEP_COMMAND_CHECKPOINT);
  if (!scheduled.ok()) return response;  // stops at once; the job restarts from an older one
  StateLock lock(&state_);
  auto j = state_.jobs.find(response.job_id());
  if (j == state_.jobs.end() || j->second.controller.phase() == Phase::kRecovering) return response;
  WorkerPool::Worker* w = state_.pool.Find(worker_id);
  j->second.controller.Drain(worker_id, w != nullptr ? w->info.address() : std::string("?"),
                             *scheduled);
  state_.Carry(j->second);
  response.set_checkpoint_step(j->second.controller.drain_step());
  return response;
}

absl::StatusOr<std::shared_ptr<rendezvous::KeyValueStore>> WorkerManager::Rendezvous(
    const std::string& session, const std::string& job_id, int generation) {
  absl::MutexLock lock(&state_.mu);
  PT_ASSIGN_OR_RETURN(WorkerPool::Worker * caller, state_.Caller(session, ""));
  if (caller->info.job_id() != job_id) {
    return absl::PermissionDeniedError(
        absl::StrCat(caller->info.id(), " runs no rank of job ", job_id));
  }
  auto it = state_.jobs.find(job_id);
  std::shared_ptr<rendezvous::KeyValueStore> store = state_.rendezvous.Find(job_id);
  if (it == state_.jobs.end() || it->second.controller.job().state() != v1::JOB_STATE_RUNNING ||
      !store) {
    return absl::NotFoundError(absl::StrCat("job ", job_id, " is not running here"));
  }
  if (generation != it->second.controller.job().generation()) {
    return absl::FailedPreconditionError(
        absl::StrCat("generation ", generation, " of job ", job_id, " has ended (it runs ",
                     it->second.controller.job().generation(), "): its ranks meet no more"));
  }
  return store;
}

void WorkerManager::OnWorkerLost(const WorkerPool::Lost& lost) {
  std::fprintf(stderr, "coordinator: %s (%s) lost: %s\n", lost.id.c_str(), lost.address.c_str(),
               lost.why.c_str());
  auto j = state_.jobs.find(lost.job_id);
  if (j == state_.jobs.end()) return;
  j->second.controller.WorkerLost(lost.rank, lost.generation, lost.silent,
                                  absl::StrCat(lost.id, " (", lost.address, ")"), lost.why,
                                  kLeaseIntervals * state_.options.heartbeat_interval);
  state_.Carry(j->second);
}

std::vector<std::string> WorkerManager::HeldStateJobsOf(const std::string& worker_id) {
  std::vector<std::string> out;
  for (auto it = state_.holding_jobs.begin(); it != state_.holding_jobs.end();) {
    auto j = state_.jobs.find(*it);
    if (j == state_.jobs.end() || !j->second.controller.KeepsHeldState()) {
      it = state_.holding_jobs.erase(it);
      continue;
    }
    if (j->second.controller.held_state()->HeldBy(worker_id)) out.push_back(*it);
    ++it;
  }
  return out;
}

}  // namespace pipetrain::coordinator
