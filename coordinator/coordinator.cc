#include "coordinator/coordinator.h"

#include <algorithm>
#include <numeric>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "proto/job_spec.h"
#include "rpc/status.h"
#include "runtime/control/step_commands.h"

namespace pipetrain::coordinator {
namespace {

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

// "flush", "switch", "checkpoint", "stop": the names the CLI takes.
std::string CommandName(v1::StepCommand command) {
  return control::StepCommandsName(proto::StepCommandBit(command));
}

bool Ended(v1::JobState s) {
  return s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED ||
         s == v1::JOB_STATE_CANCELLED;
}

std::string Rank(const v1::Job& job, int rank) {
  return job.replicas() > 1 ? absl::StrCat("stage ", rank % job.stages(), " replica ",
                                           rank / job.stages())
                            : absl::StrCat("stage ", rank);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Open(const CoordinatorOptions& options) {
  auto store = JobStore::Open(options.db_path);
  if (!store.ok()) return store.status();
  std::unique_ptr<Coordinator> c(new Coordinator(options, std::move(store).value()));
  if (absl::Status s = c->Load(); !s.ok()) return s;
  c->monitor_ = std::thread([raw = c.get()] { raw->Monitor(); });
  return c;
}

Coordinator::Coordinator(CoordinatorOptions options, std::unique_ptr<JobStore> store)
    : options_(std::move(options)), store_(std::move(store)) {}

Coordinator::~Coordinator() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (monitor_.joinable()) monitor_.join();
  std::vector<Call> calls;
  {
    std::lock_guard<std::mutex> lock(mu_);
    calls.swap(calls_);
  }
  for (Call& c : calls) c.thread.join();
}

absl::Status Coordinator::Load() {
  auto stored = store_->LoadJobs();
  if (!stored.ok()) return stored.status();
  std::lock_guard<std::mutex> lock(mu_);
  for (const StoredJob& s : *stored) {
    JobEntry entry;
    if (!entry.job.ParseFromString(s.job)) {
      return absl::DataLossError(absl::StrCat("job store: job ", s.id, " is unreadable"));
    }
    entry.order = next_order_++;
    auto config = proto::JobConfigFromSpec(entry.job.spec());
    if (config.ok()) entry.config = *config;
    auto [it, inserted] = jobs_.emplace(s.id, std::move(entry));
    JobEntry& e = it->second;
    if (e.job.state() == v1::JOB_STATE_RUNNING) {
      e.job.set_state(v1::JOB_STATE_FAILED);
      // Progress is written at most once a second: the steps recorded, not those run.
      e.job.set_message(absl::StrCat("interrupted by a coordinator restart (", e.job.step() + 1,
                                     " of ", e.job.steps(), " steps recorded); its workers stop ",
                                     "their stages and rejoin the pool"));
      e.job.set_finished_unix_ms(NowMs());
      for (auto& st : *e.job.mutable_stage_status()) {
        if (st.state() != "done") st.set_state("interrupted");
      }
      Event(s.id, e.job.message());
      Changed(e);
    }
  }
  return absl::OkStatus();
}

void Coordinator::Changed(JobEntry& entry, bool progress_only) {
  ++entry.version;
  changed_.notify_all();
  const absl::Time now = absl::Now();
  if (progress_only && now - entry.persisted_at < absl::Seconds(1)) return;
  entry.persisted_at = now;
  if (absl::Status s = store_->PutJob(entry.job.id(), entry.order, entry.job.SerializeAsString());
      !s.ok()) {
    std::fprintf(stderr, "coordinator: %s\n", std::string(s.message()).c_str());
  }
}

void Coordinator::Event(const std::string& job_id, const std::string& text) {
  if (auto s = store_->AppendEvent(job_id, NowMs(), text); !s.ok()) {
    std::fprintf(stderr, "coordinator: %s\n", std::string(s.status().message()).c_str());
  }
  std::fprintf(stderr, "coordinator: %s: %s\n", job_id.c_str(), text.c_str());
  changed_.notify_all();
}

void Coordinator::Later(std::function<void()> call) {
  for (Call& c : calls_) {
    if (c.done->load()) c.thread.join();
  }
  calls_.erase(std::remove_if(calls_.begin(), calls_.end(),
                              [](const Call& c) { return !c.thread.joinable(); }),
               calls_.end());
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread thread([call = std::move(call), done] {
    call();
    done->store(true);
  });
  calls_.push_back({std::move(thread), done});
}

absl::StatusOr<v1::Job> Coordinator::Submit(const v1::JobSpec& spec) {
  absl::StatusOr<job::JobConfig> config = proto::JobConfigFromSpec(spec);
  if (!config.ok()) return config.status();
  std::lock_guard<std::mutex> lock(mu_);
  JobEntry entry;
  entry.order = next_order_++;
  entry.config = *config;
  v1::Job& job = entry.job;
  job.set_id(absl::StrFormat("job-%04d", entry.order + 1));
  *job.mutable_spec() = spec;
  job.set_state(v1::JOB_STATE_QUEUED);
  job.set_stages(job::PipelineStages(*config));
  job.set_replicas(config->replicas);
  job.set_steps(config->steps);
  job.set_step(-1);
  job.set_submitted_unix_ms(NowMs());
  const bool tokens = job::EffectiveDataKind(*config) != "classification";
  job.set_data_unit(tokens ? "tok" : "samples");
  entry.tokens_per_step = static_cast<int64_t>(config->replicas) * config->micro_batches *
                          config->micro_batch_size * (tokens ? config->data.seq_len : 1);
  const std::string id = job.id();
  auto [it, inserted] = jobs_.emplace(id, std::move(entry));
  Changed(it->second);
  Event(id, absl::StrCat("submitted", job.spec().name().empty() ? "" : " as ", job.spec().name(),
                         ": ", it->second.job.stages(), " stages x ",
                         it->second.job.replicas(), " replicas, ",
                         it->second.job.steps(), " steps; needs ",
                         it->second.job.stages() * it->second.job.replicas(), " workers"));
  Schedule();
  return jobs_.at(id).job;
}

absl::StatusOr<v1::Job> Coordinator::Get(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", id));
  return it->second.job;
}

std::vector<v1::Job> Coordinator::List() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<const JobEntry*> entries;
  for (const auto& [id, e] : jobs_) entries.push_back(&e);
  std::sort(entries.begin(), entries.end(),
            [](const JobEntry* a, const JobEntry* b) { return a->order < b->order; });
  std::vector<v1::Job> jobs;
  for (const JobEntry* e : entries) jobs.push_back(e->job);
  return jobs;
}

absl::StatusOr<v1::Job> Coordinator::Cancel(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", id));
  if (Ended(it->second.job.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id, " already ended (", v1::JobState_Name(it->second.job.state()),
                     ")"));
  }
  EndJob(it->second, v1::JOB_STATE_CANCELLED, "cancelled by the user");
  Schedule();
  return it->second.job;
}

absl::StatusOr<v1::SendCommandResponse> Coordinator::SendCommand(
    const v1::SendCommandRequest& request) {
  std::shared_ptr<v1::WorkerService::Stub> stub;
  std::string worker_id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(request.job_id());
    if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", request.job_id()));
    JobEntry& e = it->second;
    if (proto::StepCommandBit(request.command()) == 0) {
      return absl::InvalidArgumentError("command: give flush, switch, checkpoint or stop");
    }
    if (e.job.state() != v1::JOB_STATE_RUNNING) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", e.job.id(), " is not running (", v1::JobState_Name(e.job.state()),
          "): step commands go to running jobs"));
    }
    if (request.command() == v1::STEP_COMMAND_CHECKPOINT && !e.job.spec().has_weights_dir()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", e.job.id(), " has no weights_dir: a checkpoint is written to "
          "<weights_dir>/checkpoint-N/ on each worker"));
    }
    worker_id = e.rank_worker.empty() ? "" : e.rank_worker[0];
    auto w = workers_.find(worker_id);
    if (w == workers_.end()) {
      return absl::UnavailableError(absl::StrCat("the worker of rank 0 of ", e.job.id(),
                                                 " is not known"));
    }
    stub = w->second.stub;
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::SendCommandResponse response;
  grpc::Status s = stub->ScheduleCommand(&ctx, request, &response);
  if (!s.ok()) return rpc::ToAbslStatus(s);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(request.job_id());
  if (it != jobs_.end()) {
    if (request.command() == v1::STEP_COMMAND_STOP) it->second.stop_step = response.step();
    Event(request.job_id(), absl::StrCat(CommandName(request.command()),
                                         " scheduled before step ", response.step()));
    Changed(it->second);
  }
  return response;
}

absl::StatusOr<std::shared_ptr<rendezvous::KeyValueStore>> Coordinator::Rendezvous(
    const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || it->second.job.state() != v1::JOB_STATE_RUNNING || !it->second.store) {
    return absl::NotFoundError(absl::StrCat("job ", job_id, " is not running here"));
  }
  return it->second.store;
}

absl::StatusOr<std::pair<v1::Job, int64_t>> Coordinator::WaitForChange(const std::string& id,
                                                                        int64_t version,
                                                                        absl::Time deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", id));
    if (it->second.version != version || stopping_ || absl::Now() >= deadline) {
      return std::make_pair(it->second.job, it->second.version);
    }
    changed_.wait_for(lock, std::chrono::milliseconds(
                                std::max<int64_t>(1, absl::ToInt64Milliseconds(deadline - absl::Now()))));
  }
}

absl::StatusOr<std::vector<v1::JobEvent>> Coordinator::Events(const std::string& id,
                                                              int64_t after_seq) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!jobs_.count(id)) return absl::NotFoundError(absl::StrCat("no job ", id));
  }
  auto stored = store_->Events(id, after_seq);
  if (!stored.ok()) return stored.status();
  std::vector<v1::JobEvent> events;
  for (const StoredEvent& s : *stored) {
    v1::JobEvent e;
    e.set_job_id(id);
    e.set_seq(s.seq);
    e.set_unix_ms(s.unix_ms);
    e.set_text(s.text);
    events.push_back(std::move(e));
  }
  return events;
}

std::vector<v1::WorkerInfo> Coordinator::Workers() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<v1::WorkerInfo> out;
  for (const auto& [id, w] : workers_) out.push_back(w.info);
  return out;
}

absl::StatusOr<v1::RegisterWorkerResponse> Coordinator::Register(
    const v1::RegisterWorkerRequest& request) {
  if (request.address().empty()) {
    return absl::InvalidArgumentError("address: the worker's service address is required");
  }
  auto channel = rpc::MakeChannel(request.address(), options_.security);
  if (!channel.ok()) return channel.status();
  std::lock_guard<std::mutex> lock(mu_);
  WorkerEntry w;
  // Numbered in the store: a worker still known by its id from before a restart must not
  // find that id given to another (its heartbeats would pass for the other's).
  auto number = store_->Increment("worker");
  if (!number.ok()) {
    std::fprintf(stderr, "coordinator: %s\n", std::string(number.status().message()).c_str());
  }
  next_worker_ = std::max(next_worker_ + 1, number.ok() ? *number : int64_t{0});
  w.info.set_id(absl::StrFormat("worker-%d", next_worker_));
  w.info.set_address(request.address());
  w.info.set_device(request.device().empty() ? "cpu" : request.device());
  w.info.set_memory_bytes(request.memory_bytes());
  w.info.set_state("idle");
  w.info.set_rank(-1);
  w.last_heartbeat = absl::Now();
  w.info.set_last_heartbeat_unix_ms(NowMs());
  w.stub = v1::WorkerService::NewStub(*channel);
  v1::RegisterWorkerResponse response;
  response.set_worker_id(w.info.id());
  response.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
  std::fprintf(stderr, "coordinator: %s registered (%s, %s%s%s)\n", w.info.id().c_str(),
               request.address().c_str(), w.info.device().c_str(),
               request.name().empty() ? "" : ", ", request.name().c_str());
  workers_.emplace(w.info.id(), std::move(w));
  Schedule();
  return response;
}

absl::Status Coordinator::Heartbeat(const v1::HeartbeatRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(request.worker_id());
  if (it == workers_.end() || it->second.info.state() == "lost") {
    return absl::NotFoundError(absl::StrCat("unknown worker ", request.worker_id(),
                                            ": register again"));
  }
  WorkerEntry& w = it->second;
  w.last_heartbeat = absl::Now();
  w.info.set_last_heartbeat_unix_ms(NowMs());
  if (!request.job_id().empty()) {
    auto j = jobs_.find(request.job_id());
    const bool rank_known = j != jobs_.end() && request.rank() >= 0 &&
                            request.rank() < static_cast<int>(j->second.rank_ended.size());
    if (j == jobs_.end() || (j->second.job.state() != v1::JOB_STATE_RUNNING &&
                             !(rank_known && j->second.rank_ended[request.rank()]))) {
      // Its stage outlived its job (a stop that reached the worker before the assignment,
      // a job ended while it was unreachable): stop it again, or it would hold the worker.
      auto stub = w.stub;
      const std::string job_id = request.job_id();
      Later([stub, job_id] {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
        v1::StopStageRequest stop;
        stop.set_job_id(job_id);
        stop.set_reason(absl::StrCat("job ", job_id, " is no longer running"));
        v1::AssignResponse response;
        (void)stub->StopStage(&ctx, stop, &response);
      });
    }
    if (j != jobs_.end() && request.rank() >= 0 &&
        request.rank() < j->second.job.stage_status_size()) {
      v1::StageStatus* st = j->second.job.mutable_stage_status(request.rank());
      if (st->action() != request.action() || st->waiting_for() != request.waiting_for()) {
        st->set_action(request.action());
        st->set_waiting_for(request.waiting_for());
        ++j->second.version;
        changed_.notify_all();
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::ReportResponse> Coordinator::ReportStep(const v1::StepReport& r) {
  std::lock_guard<std::mutex> lock(mu_);
  return ReportStepLocked(r);
}

absl::StatusOr<v1::ReportResponse> Coordinator::ReportSteps(const v1::StepReports& reports) {
  std::lock_guard<std::mutex> lock(mu_);
  v1::ReportResponse response;
  for (const v1::StepReport& r : reports.reports()) {
    absl::StatusOr<v1::ReportResponse> one = ReportStepLocked(r);
    if (!one.ok()) return one.status();
    if (one->stop()) response.set_stop(true);
  }
  return response;
}

absl::StatusOr<v1::ReportResponse> Coordinator::ReportStepLocked(const v1::StepReport& r) {
  v1::ReportResponse response;
  auto it = jobs_.find(r.job_id());
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", r.job_id()));
  JobEntry& e = it->second;
  if (e.job.state() != v1::JOB_STATE_RUNNING) {
    response.set_stop(true);
    return response;
  }
  if (r.rank() < 0 || r.rank() >= e.job.stage_status_size()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", r.rank(), " out of range"));
  }
  v1::StageStatus* st = e.job.mutable_stage_status(r.rank());
  st->set_step(r.step());
  st->set_compute_s(r.compute_s());
  st->set_wait_s(r.wait_s());
  st->set_parameter_bytes(r.parameter_bytes());
  st->set_peak_memory_bytes(r.peak_memory_bytes());
  st->set_state("running");
  e.rank_step[r.rank()] = r.step();
  if (r.has_loss()) e.step_losses[r.step()].push_back(r.loss());
  if (r.commands_after_size() > 0 &&
      ++e.command_reports[r.step() + 1] == e.job.stage_status_size()) {
    uint32_t bits = 0;
    for (int c : r.commands_after()) bits |= proto::StepCommandBit(static_cast<v1::StepCommand>(c));
    Event(e.job.id(), absl::StrCat(control::StepCommandsName(bits), " took effect before step ",
                                   r.step() + 1, " on all ", e.job.stage_status_size(),
                                   " ranks"));
  }
  if (r.rank() == 0) {
    if (r.step() == 0) e.first_end_s = r.end_s();
    if (r.step() > 0 && e.first_end_s >= 0 && r.end_s() > e.first_end_s) {
      e.job.set_tokens_per_s(static_cast<double>(e.tokens_per_step) * r.step() /
                             (r.end_s() - e.first_end_s));
    }
  }
  const int64_t done = *std::min_element(e.rank_step.begin(), e.rank_step.end());
  if (done > e.job.step()) {
    // The loss of a step is known once every replica's last stage reported it.
    for (int64_t t = e.job.step() + 1; t <= done; ++t) {
      auto losses = e.step_losses.find(t);
      if (losses != e.step_losses.end() && !losses->second.empty()) {
        e.job.set_loss(std::accumulate(losses->second.begin(), losses->second.end(), 0.0) /
                       losses->second.size());
        e.step_losses.erase(losses);
      }
    }
    e.job.set_step(done);
    const int64_t every = std::max(1, e.job.steps() / 10);
    if ((done + 1) % every == 0 || done + 1 == e.job.steps()) {
      Event(e.job.id(), absl::StrFormat("step %d/%d loss %.4f %.0f %s/s", done + 1,
                                        e.job.steps(), e.job.loss(), e.job.tokens_per_s(),
                                        e.job.data_unit()));
    }
  }
  Changed(e, /*progress_only=*/true);
  return response;
}

absl::StatusOr<v1::ReportResponse> Coordinator::ReportStageEnd(const v1::StageEnd& end) {
  std::lock_guard<std::mutex> lock(mu_);
  v1::ReportResponse response;
  auto w = workers_.find(end.worker_id());
  if (w != workers_.end() && w->second.info.job_id() == end.job_id()) {
    w->second.info.set_state("idle");
    w->second.info.set_job_id("");
    w->second.info.set_rank(-1);
  }
  auto it = jobs_.find(end.job_id());
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", end.job_id()));
  JobEntry& e = it->second;
  if (end.rank() >= 0 && end.rank() < e.job.stage_status_size() &&
      e.job.state() == v1::JOB_STATE_RUNNING) {
    e.rank_ended[end.rank()] = true;
    v1::StageStatus* st = e.job.mutable_stage_status(end.rank());
    st->set_state(end.ok() ? "done" : "failed");
    st->set_action("");
    st->set_waiting_for("");
    const bool all_ended =
        std::all_of(e.rank_ended.begin(), e.rank_ended.end(), [](bool b) { return b; });
    if (!end.ok() && e.pending_failure.empty()) {
      e.pending_failure = absl::StrCat(Rank(e.job, end.rank()), " on ", end.worker_id(),
                                       " failed: ", end.error());
      e.pending_since = absl::Now();
      // Held back (see Monitor) unless no rank is left running whose worker may be the cause.
      if (!all_ended) Event(e.job.id(), e.pending_failure);
    }
    if (all_ended) {
      EndJob(e, e.pending_failure.empty() ? v1::JOB_STATE_SUCCEEDED : v1::JOB_STATE_FAILED,
             e.pending_failure.empty() && e.stop_step > 0
                 ? absl::StrCat("stopped before step ", e.stop_step, " by a stop command")
                 : e.pending_failure);
    } else {
      Changed(e);
    }
  }
  Schedule();
  return response;
}

void Coordinator::EndJob(JobEntry& e, v1::JobState state, const std::string& message) {
  const bool was_running = e.job.state() == v1::JOB_STATE_RUNNING;
  e.job.set_state(state);
  e.job.set_message(message);
  e.job.set_finished_unix_ms(NowMs());
  if (state == v1::JOB_STATE_SUCCEEDED) {
    Event(e.job.id(), absl::StrFormat("succeeded: %d steps, final loss %.4f, %.1f s",
                                      e.job.steps(), e.job.loss(),
                                      (e.job.finished_unix_ms() - e.job.started_unix_ms()) / 1e3));
  } else {
    Event(e.job.id(), absl::StrCat(state == v1::JOB_STATE_CANCELLED ? "cancelled" : "failed",
                                   ": ", message));
  }
  if (was_running) {
    for (size_t r = 0; r < e.rank_worker.size(); ++r) {
      if (e.rank_ended[r]) continue;
      auto w = workers_.find(e.rank_worker[r]);
      if (w == workers_.end() || w->second.info.state() == "lost") continue;
      auto stub = w->second.stub;
      const std::string job_id = e.job.id(), reason = message;
      Later([stub, job_id, reason] {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
        v1::StopStageRequest request;
        request.set_job_id(job_id);
        request.set_reason(reason);
        v1::AssignResponse response;
        (void)stub->StopStage(&ctx, request, &response);
      });
    }
  }
  e.store.reset();
  Changed(e);
}

void Coordinator::Schedule() {
  std::vector<JobEntry*> queued;
  for (auto& [id, e] : jobs_) {
    if (e.job.state() == v1::JOB_STATE_QUEUED) queued.push_back(&e);
  }
  std::sort(queued.begin(), queued.end(),
            [](const JobEntry* a, const JobEntry* b) { return a->order < b->order; });
  for (JobEntry* e : queued) {
    std::vector<WorkerEntry*> idle;
    for (auto& [id, w] : workers_) {
      if (w.info.state() == "idle") idle.push_back(&w);
    }
    const int needed = e->job.stages() * e->job.replicas();
    if (static_cast<int>(idle.size()) < needed) {
      if (!e->queue_logged) {
        Event(e->job.id(), absl::StrCat("queued: needs ", needed, " workers, ", idle.size(),
                                        " idle"));
        e->queue_logged = true;
      }
      continue;  // a later, smaller job may still fit
    }
    e->store = rendezvous::MakeMemoryStore();
    e->job.set_state(v1::JOB_STATE_RUNNING);
    e->job.set_started_unix_ms(NowMs());
    e->job.clear_stage_status();
    e->rank_worker.assign(needed, "");
    e->rank_ended.assign(needed, false);
    e->rank_step.assign(needed, -1);
    std::vector<std::string> placed;
    for (int r = 0; r < needed; ++r) {
      WorkerEntry* w = idle[r];
      w->info.set_state("busy");
      w->info.set_job_id(e->job.id());
      w->info.set_rank(r);
      e->rank_worker[r] = w->info.id();
      v1::StageStatus* st = e->job.add_stage_status();
      st->set_stage(r % e->job.stages());
      st->set_replica(r / e->job.stages());
      st->set_worker_id(w->info.id());
      st->set_step(-1);
      st->set_state("assigned");
      placed.push_back(absl::StrCat(Rank(e->job, r), " on ", w->info.id()));
      v1::StageAssignment assignment;
      assignment.set_job_id(e->job.id());
      *assignment.mutable_spec() = e->job.spec();
      assignment.set_rank(r);
      auto stub = w->stub;
      const std::string worker_id = w->info.id(), job_id = e->job.id();
      Later([this, stub, assignment, worker_id, job_id] {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
        v1::AssignResponse response;
        grpc::Status s = stub->AssignStage(&ctx, assignment, &response);
        if (s.ok()) return;
        std::lock_guard<std::mutex> lock(mu_);
        auto it = jobs_.find(job_id);
        if (it != jobs_.end() && it->second.job.state() == v1::JOB_STATE_RUNNING) {
          auto w = workers_.find(worker_id);
          if (w != workers_.end()) {
            w->second.info.set_state("idle");
            w->second.info.set_job_id("");
            w->second.info.set_rank(-1);
          }
          it->second.rank_ended[assignment.rank()] = true;
          EndJob(it->second, v1::JOB_STATE_FAILED,
                 absl::StrCat("assigning ", Rank(it->second.job, assignment.rank()), " to ",
                              worker_id, " failed: ", s.error_message()));
          Schedule();
        }
      });
    }
    Event(e->job.id(), absl::StrCat("running: ", absl::StrJoin(placed, ", ")));
    Changed(*e);
  }
}

void Coordinator::Monitor() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    // Until the next worker is due to be lost (so that it is lost two intervals after its
    // last heartbeat, not up to a tick later), or a quarter interval at most.
    absl::Duration wait = std::max(absl::Milliseconds(10), options_.heartbeat_interval / 4);
    for (const auto& [id, w] : workers_) {
      if (w.info.state() == "lost") continue;
      wait = std::min(wait, w.last_heartbeat + 2 * options_.heartbeat_interval +
                                absl::Milliseconds(1) - absl::Now());
    }
    // Woken early only to stop (job changes notify the same variable: they do not count).
    if (changed_.wait_for(lock,
                          std::chrono::microseconds(std::max<int64_t>(
                              1000, absl::ToInt64Microseconds(wait))),
                          [this] { return stopping_; })) {
      break;
    }
    const absl::Time now = absl::Now();
    for (auto& [id, w] : workers_) {
      if (w.info.state() == "lost" || now - w.last_heartbeat <= 2 * options_.heartbeat_interval) {
        continue;
      }
      const std::string job_id = w.info.job_id();
      const int rank = w.info.rank();
      w.info.set_state("lost");
      w.info.set_job_id("");
      w.info.set_rank(-1);
      std::fprintf(stderr, "coordinator: %s (%s) lost: no heartbeat for %s\n", id.c_str(),
                   w.info.address().c_str(),
                   absl::FormatDuration(absl::Trunc(now - w.last_heartbeat,
                                                    absl::Milliseconds(1))).c_str());
      auto j = jobs_.find(job_id);
      if (j != jobs_.end() && j->second.job.state() == v1::JOB_STATE_RUNNING) {
        j->second.rank_ended[rank] = true;
        if (rank < j->second.job.stage_status_size()) {
          j->second.job.mutable_stage_status(rank)->set_state("lost");
        }
        EndJob(j->second, v1::JOB_STATE_FAILED,
               absl::StrCat(id, " (", w.info.address(), ") running ", Rank(j->second.job, rank),
                            " stopped sending heartbeats (none for ",
                            absl::FormatDuration(absl::Trunc(now - w.last_heartbeat,
                                                             absl::Milliseconds(1))),
                            ")"));
      }
    }
    // A held-back rank failure becomes the job's once every worker of a rank still running
    // has heartbeated more than half an interval after it (so that a heartbeat sent before
    // a peer died, still on its way, does not count); a lost one ended the job above.
    for (auto& [id, e] : jobs_) {
      if (e.job.state() != v1::JOB_STATE_RUNNING || e.pending_failure.empty()) continue;
      bool alive = true;
      for (size_t r = 0; r < e.rank_worker.size(); ++r) {
        auto w = workers_.find(e.rank_worker[r]);
        if (!e.rank_ended[r] && w != workers_.end() &&
            w->second.last_heartbeat <= e.pending_since + options_.heartbeat_interval / 2) {
          alive = false;
        }
      }
      if (alive) EndJob(e, v1::JOB_STATE_FAILED, e.pending_failure);
    }
    Schedule();
  }
}

}  // namespace pipetrain::coordinator
