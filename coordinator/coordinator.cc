#include "coordinator/coordinator.h"

#include <algorithm>
#include <filesystem>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "coordinator/placement.h"
#include "coordinator/report_checks.h"
#include "jobspec/job_config_from_spec.h"
#include "jobspec/step_commands.h"
#include "runtime/model/model_config.h"
#include "runtime/model/partition.h"
#include "rpc/security.h"
#include "rpc/status.h"
#include "runtime/base/status_macros.h"
#include "runtime/control/step_commands.h"

namespace pipetrain::coordinator {
namespace {

// What one rank of `layout` holds for its parameters, for the largest stage: each parameter
// in its weight versions (two for 2BW), its gradient and the optimizer's slots (AdamW two,
// SGD with momentum one), at the job's dtype. Activations are not counted. nullopt where it
// is not known without building the model (TorchScript).
std::optional<int64_t> RankParameterStateBytes(const job::JobConfig& c, const Layout& layout) {
  model::ModelConfig m = c.model;
  const std::string kind = job::EffectiveDataKind(c);
  if (kind != "classification") {
    m.vocab_size = c.data.vocab > 0 ? c.data.vocab : (kind == "bytes" ? 256 : 65536);
    m.seq_len = c.data.seq_len;
  }
  absl::StatusOr<std::vector<model::LayerInfo>> layers = model::BuiltinLayers(m);
  if (!layers.ok()) return std::nullopt;
  std::vector<double> counts;
  for (const model::LayerInfo& l : *layers) counts.push_back(static_cast<double>(l.num_parameters));
  absl::StatusOr<std::vector<model::LayerRange>> ranges =
      layout.stages == job::PipelineStages(c) && !c.stage_ranges.empty()
          ? absl::StatusOr<std::vector<model::LayerRange>>(c.stage_ranges)
          : model::BalancedPartition(counts, layout.stages);
  if (!ranges.ok()) return std::nullopt;
  double largest = 0;
  for (const model::LayerRange& r : *ranges) {
    double sum = 0;
    for (int i = r.begin; i < r.end && i < static_cast<int>(counts.size()); ++i) sum += counts[i];
    largest = std::max(largest, sum);
  }
  const int versions = c.schedule == schedule::ScheduleKind::kTwoBW ? 2 : 1;
  const int slots = c.optimizer.name == "adamw" ? 2 : (c.optimizer.momentum > 0 ? 1 : 0);
  const int element = c.precision == job::Precision::kFloat64 ? 8 : 4;  // bf16 keeps fp32 weights
  return static_cast<int64_t>(largest) * element * (versions + 1 + slots);
}

// "host:port", "[v6]:port": a host of letters, digits, '.', '-', '_' (or an IPv6 address in
// brackets) and a port in 1..65535. What a channel is made to, so nothing else is taken.
bool IsServiceAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 1 || port > 65535) {
    return false;
  }
  std::string host = address.substr(0, colon);
  if (host.front() == '[') {
    if (host.back() != ']' || host.size() < 3) return false;
    host = host.substr(1, host.size() - 2);
    return std::all_of(host.begin(), host.end(), [](char c) {
      return absl::ascii_isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.';
    });
  }
  return std::all_of(host.begin(), host.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_';
  });
}

// "flush", "switch", "checkpoint", "stop": the names the CLI takes.
std::string CommandName(v1::StepCommand command) {
  return control::StepCommandsName(jobspec::StepCommandBit(command));
}

// "queued", "running", "succeeded", "failed", "cancelled".
std::string StateName(v1::JobState s) {
  std::string name = v1::JobState_Name(s);
  name = name.substr(name.rfind('_') + 1);
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return name;
}

bool Ended(v1::JobState s) {
  return s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED ||
         s == v1::JOB_STATE_CANCELLED;
}

// The state a job's record shows for its phase.
v1::JobState JobStateOf(Phase phase) {
  switch (phase) {
    case Phase::kQueued: return v1::JOB_STATE_QUEUED;
    case Phase::kSucceeded: return v1::JOB_STATE_SUCCEEDED;
    case Phase::kFailed: return v1::JOB_STATE_FAILED;
    case Phase::kCancelled: return v1::JOB_STATE_CANCELLED;
    case Phase::kRunning:
    case Phase::kHeldFailure:
    case Phase::kRecovering: return v1::JOB_STATE_RUNNING;
  }
  return v1::JOB_STATE_UNSPECIFIED;
}

// A stored job's run, as a coordinator that starts finds it: ranks of a running job are not
// known (their workers register again).
JobRun RunFromRecord(const v1::Job& job) {
  JobRun run;
  switch (job.state()) {
    case v1::JOB_STATE_RUNNING: run.phase = Phase::kRunning; break;
    case v1::JOB_STATE_SUCCEEDED: run.phase = Phase::kSucceeded; break;
    case v1::JOB_STATE_FAILED: run.phase = Phase::kFailed; break;
    case v1::JOB_STATE_CANCELLED: run.phase = Phase::kCancelled; break;
    default: run.phase = Phase::kQueued; break;
  }
  run.generation = job.generation();
  run.restarts = job.restarts();
  return run;
}

std::string Rank(const v1::Job& job, int rank) {
  return job.replicas() > 1 ? absl::StrCat("stage ", rank % job.stages(), " replica ",
                                           rank / job.stages())
                            : absl::StrCat("stage ", rank);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Open(const CoordinatorOptions& options) {
  absl::StatusOr<std::unique_ptr<JobStore>> store = OpenSqliteJobStore(options.db_path);
  if (!store.ok()) return store.status();
  CoordinatorDeps deps;
  deps.store = *std::move(store);
  return Open(options, std::move(deps));
}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Open(const CoordinatorOptions& options,
                                                               CoordinatorDeps deps) {
  if (!deps.store) return absl::InvalidArgumentError("a coordinator needs a job store");
  if (!deps.clock) deps.clock = std::make_shared<RealClock>();
  if (!deps.connect) deps.connect = GrpcWorkerConnector(options.security);
  const bool monitor = deps.start_monitor;
  std::unique_ptr<Coordinator> c(new Coordinator(options, std::move(deps)));
  if (absl::Status s = c->Load(); !s.ok()) return s;
  if (monitor) {
    c->last_pass_ms_.store(absl::ToUnixMillis(c->deps_.clock->Now()));
    c->monitor_ = std::thread([raw = c.get()] { raw->Monitor(); });
  }
  return c;
}

Coordinator::Coordinator(CoordinatorOptions options, CoordinatorDeps deps)
    : options_(std::move(options)),
      deps_(std::move(deps)),
      planner_({options_.planning_cpu_budget, options_.planning_time_limit,
                options_.planning_wait}),
      writes_(deps_.store.get()) {}

int64_t Coordinator::NowMs() const { return absl::ToUnixMillis(deps_.clock->Now()); }

void Coordinator::StopMonitor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (monitor_.joinable()) monitor_.join();
}

Coordinator::~Coordinator() {
  StopMonitor();
  std::vector<Call> calls;
  {
    std::lock_guard<std::mutex> lock(mu_);
    calls.swap(calls_);
  }
  for (Call& c : calls) c.thread.join();
}

absl::Status Coordinator::Load() {
  auto stored = deps_.store->LoadJobs();
  if (!stored.ok()) return stored.status();
  {
  std::lock_guard<std::mutex> lock(mu_);
  for (const StoredJob& s : *stored) {
    JobEntry entry;
    entry.durable = true;
    if (!entry.job.ParseFromString(s.job)) {
      return absl::DataLossError(absl::StrCat("job store: job ", s.id, " is unreadable"));
    }
    entry.order = next_order_++;
    auto config = jobspec::JobConfigFromSpec(entry.job.spec());
    if (config.ok()) entry.config = *config;
    entry.run = RunFromRecord(entry.job);
    auto [it, inserted] = jobs_.emplace(s.id, std::move(entry));
    JobEntry& e = it->second;
    if (e.job.state() == v1::JOB_STATE_RUNNING && config.ok() &&
        e.job.restarts() < e.config.max_restarts) {
      // Its workers stop their stages when their next heartbeat is refused and register
      // again; the job waits for them (PlaceRecovering).
      ApplyEvent(e, Fault{absl::StrCat("the coordinator restarted (", e.job.step() + 1, " of ",
                                       e.job.steps(), " steps recorded)")});
    } else if (e.job.state() == v1::JOB_STATE_RUNNING) {
      // Not a transition of its life but what was found: it ran when the coordinator stopped.
      e.run.phase = Phase::kFailed;
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
  }
  if (absl::Status s = FlushWrites(); !s.ok()) {
    std::fprintf(stderr, "coordinator: %s\n", std::string(s.message()).c_str());
  }
  return absl::OkStatus();
}

void Coordinator::Changed(JobEntry& entry, bool progress_only) {
  ++entry.version;
  changed_.notify_all();
  const absl::Time now = deps_.clock->Now();
  if (progress_only && now - entry.persisted_at < absl::Seconds(1)) return;
  entry.persisted_at = now;
  writes_.QueueSteps(entry.job.id(), entry.unwritten_steps);
  entry.unwritten_steps.clear();
  writes_.QueueJob(entry.job.id(), entry.order, entry.job.SerializeAsString());
}

void Coordinator::Event(const std::string& job_id, const std::string& text) {
  writes_.QueueEvent(job_id, NowMs(), text);
  std::fprintf(stderr, "coordinator: %s: %s\n", job_id.c_str(), text.c_str());
  changed_.notify_all();
}

absl::Status Coordinator::FlushWrites() { return writes_.Flush(); }

void Coordinator::Later(std::function<void()> call) {
  if (deps_.run_later) {
    deps_.run_later(std::move(call));
    return;
  }
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

absl::StatusOr<v1::Job> Coordinator::Submit(const v1::JobSpec& submitted,
                                            const std::string& model_profile_json) {
  v1::JobSpec spec = submitted;
  absl::StatusOr<job::JobConfig> config = jobspec::JobConfigFromSpec(spec);
  if (!config.ok()) return config.status();
  std::optional<v1::PlannedLayout> plan;
  if (config->auto_stages) {
    std::vector<v1::WorkerInfo> workers;
    {
      std::lock_guard<std::mutex> lock(mu_);
      workers = pool_.Infos();
    }
    absl::StatusOr<SubmissionPlanner::Planned> planned =
        planner_.Plan(spec, *config, model_profile_json, workers);
    if (!planned.ok()) return planned.status();
    spec = planned->spec;
    config = planned->config;
    plan = planned->record;
    if (absl::Status valid = jobspec::JobConfigFromSpec(spec).status(); !valid.ok()) {
      return absl::InternalError(absl::StrCat("the planned layout is invalid: ", valid.message()));
    }
  }
  std::string id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string own_id = absl::StrFormat("job-%04d", next_order_ + 1);
    if (absl::Status s = PlaceCheckpointDirLocked(own_id, spec, *config); !s.ok()) return s;
    JobEntry entry;
    entry.order = next_order_++;
    entry.config = *config;
    v1::Job& job = entry.job;
    job.set_id(own_id);
    *job.mutable_spec() = spec;
    job.set_state(v1::JOB_STATE_QUEUED);
    job.set_stages(job::PipelineStages(*config));
    job.set_replicas(config->replicas);
    job.set_steps(config->steps);
    job.set_step(-1);
    job.set_submitted_unix_ms(NowMs());
    if (plan) *job.mutable_plan() = *plan;
    const bool tokens = job::EffectiveDataKind(*config) != "classification";
    job.set_data_unit(tokens ? "tok" : "samples");
    entry.tokens_per_step = static_cast<int64_t>(config->replicas) * config->micro_batches *
                            config->micro_batch_size * (tokens ? config->data.seq_len : 1);
    id = job.id();
    auto [it, inserted] = jobs_.emplace(id, std::move(entry));
    const v1::Job& j = it->second.job;
    Changed(it->second);
    Event(id, absl::StrCat("submitted", j.spec().name().empty() ? "" : " as ", j.spec().name(),
                           ": ", j.stages(), " stages x ", j.replicas(), " replicas, ",
                           j.steps(), " steps; needs ", j.stages() * j.replicas(), " workers"));
    if (j.has_plan()) {
      Event(id, absl::StrFormat("planned by %s for %d workers: %s; predicted step %.2f ms",
                                j.plan().planner(), j.plan().workers(), j.plan().layout(),
                                j.plan().predicted_step_time_s() * 1e3));
    }
  }
  // Acknowledged only once durable; until then it is not scheduled.
  const absl::Status written = FlushWrites();
  v1::Job job;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(id);
    if (!written.ok() && writes_.Discard(id)) {
      jobs_.erase(it);
      return absl::UnavailableError(absl::StrCat("the job was not accepted: ", written.message()));
    }
    it->second.durable = true;
    Schedule();
    job = it->second.job;
  }
  (void)FlushWrites();
  return job;
}

absl::Status Coordinator::PlaceCheckpointDirLocked(const std::string& id, v1::JobSpec& spec,
                                                   job::JobConfig& config) const {
  if (!spec.checkpoint().has_dir()) {
    if (spec.resume_from() == "latest") {
      return absl::InvalidArgumentError(
          "resume_from: latest needs checkpoint.dir: under the coordinator a job without one "
          "keeps its checkpoints in a directory of its own (checkpoints/JOB-ID), where nothing "
          "is yet; name the directory to resume from");
    }
    const std::string own = "checkpoints/" + id;
    spec.mutable_checkpoint()->set_dir(own);
    config.checkpoint.dir = own;
    return absl::OkStatus();
  }
  // One directory however it is spelled ("a//b/", "a/x/../b"); links are not followed (the
  // coordinator does not see the workers' file systems).
  const auto normal = [](const std::string& dir) {
    std::filesystem::path p = std::filesystem::path(dir).lexically_normal();
    if (p.has_relative_path() && !p.has_filename()) p = p.parent_path();  // "a/b/" is "a/b"
    return p;
  };
  const std::filesystem::path dir = normal(spec.checkpoint().dir());
  for (const auto& [other_id, other] : jobs_) {
    const v1::JobState state = other.job.state();
    if (state != v1::JOB_STATE_QUEUED && state != v1::JOB_STATE_RUNNING) continue;
    if (normal(other.config.checkpoint.dir) == dir) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint.dir ", spec.checkpoint().dir(), " holds the checkpoints of ", other_id,
          " (", state == v1::JOB_STATE_QUEUED ? "queued" : "running",
          "): a job's checkpoints never share a directory with another's; give this one its "
          "own, or none (then it gets checkpoints/", id, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> Coordinator::Get(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", id));
  return it->second.job;
}

absl::StatusOr<v1::ListJobsResponse> Coordinator::List(int page_size,
                                                      const std::string& page_token) {
  int64_t after = -1;  // the order of the last job of the previous page
  if (!page_token.empty() && (!absl::SimpleAtoi(page_token, &after) || after < 0)) {
    return absl::InvalidArgumentError("page_token: not one this coordinator gave");
  }
  const int limit = page_size <= 0 ? 100 : std::min(page_size, 500);
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<const JobEntry*> entries;
  for (const auto& [id, e] : jobs_) {
    if (e.order > after) entries.push_back(&e);
  }
  std::sort(entries.begin(), entries.end(),
            [](const JobEntry* a, const JobEntry* b) { return a->order < b->order; });
  v1::ListJobsResponse page;
  size_t bytes = 0;
  int64_t last_order = after;
  for (const JobEntry* e : entries) {
    if (page.jobs_size() == limit || (page.jobs_size() > 0 && bytes >= kListPageBytes)) {
      page.set_next_page_token(absl::StrCat(last_order));  // more after this page
      break;
    }
    bytes += e->job.ByteSizeLong();
    *page.add_jobs() = e->job;
    last_order = e->order;
  }
  return page;
}

absl::StatusOr<v1::Job> Coordinator::Cancel(const std::string& id) {
  return LockedThenFlush([&]() -> absl::StatusOr<v1::Job> {
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", id));
    if (Ended(it->second.job.state())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", id, " already ended (", v1::JobState_Name(it->second.job.state()), ")"));
    }
    ApplyEvent(it->second, CancelRequested{});
    Schedule();
    return it->second.job;
  });
}

absl::StatusOr<v1::SendCommandResponse> Coordinator::SendCommand(
    const v1::SendCommandRequest& request) {
  absl::StatusOr<v1::SendCommandResponse> response = SendCommandUncounted(request);
  const std::string command = jobspec::StepCommandBit(request.command()) != 0
                                  ? CommandName(request.command())
                                  : std::string("unknown");
  std::lock_guard<std::mutex> lock(mu_);
  ++step_commands_[{command, response.ok() ? std::string("scheduled")
                                           : absl::StatusCodeToString(response.status().code())}];
  return response;
}

Coordinator::MetricsSnapshot Coordinator::Metrics() {
  MetricsSnapshot m;
  for (v1::JobState s : {v1::JOB_STATE_QUEUED, v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED,
                         v1::JOB_STATE_FAILED, v1::JOB_STATE_CANCELLED}) {
    m.jobs_by_state[StateName(s)] = 0;
  }
  for (const char* s : {"idle", "busy", "draining", "lost"}) m.workers_by_state[s] = 0;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, e] : jobs_) {
    ++m.jobs_by_state[StateName(e.job.state())];
    if (e.job.state() != v1::JOB_STATE_RUNNING) continue;
    MetricsSnapshot::RunningJob j;
    j.id = id;
    j.step = e.job.step();
    j.tokens_per_s = e.job.tokens_per_s();
    if (e.job.step() >= 0) j.loss = e.job.loss();
    const int p = e.job.stages();
    const std::vector<double>& per_step = e.ledger.step_compute_s();
    if (static_cast<int>(per_step.size()) >= p) {
      j.straggler_ratio = StragglerRatios(std::vector<double>(per_step.begin(), per_step.begin() + p));
    }
    m.running.push_back(std::move(j));
  }
  for (const v1::WorkerInfo& w : pool_.Infos()) ++m.workers_by_state[w.state()];
  m.workers_lost_silent = workers_lost_silent_;
  m.step_commands = step_commands_;
  return m;
}

absl::StatusOr<v1::SendCommandResponse> Coordinator::SendCommandUncounted(
    const v1::SendCommandRequest& request) {
  std::shared_ptr<WorkerClient> client;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(request.job_id());
    if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", request.job_id()));
    JobEntry& e = it->second;
    if (jobspec::StepCommandBit(request.command()) == 0) {
      return absl::InvalidArgumentError("command: give flush, switch, checkpoint or stop");
    }
    if (e.job.state() != v1::JOB_STATE_RUNNING) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", e.job.id(), " is not running (", v1::JobState_Name(e.job.state()),
          "): step commands go to running jobs"));
    }
    if (e.run.phase == Phase::kRecovering) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", e.job.id(), " is recovering from a fault (its next generation is not placed "
          "yet): send the command once it runs again"));
    }
    WorkerPool::Worker* w = pool_.Find(e.rank_worker.empty() ? "" : e.rank_worker[0]);
    if (w == nullptr) {
      return absl::UnavailableError(absl::StrCat("the worker of rank 0 of ", e.job.id(),
                                                 " is not known"));
    }
    client = w->client;
  }
  absl::StatusOr<v1::SendCommandResponse> response = client->ScheduleCommand(request);
  if (!response.ok()) return response.status();
  LockedThenFlush([&] {
    auto it = jobs_.find(request.job_id());
    if (it == jobs_.end()) return 0;
    if (request.command() == v1::STEP_COMMAND_STOP) {
      ApplyEvent(it->second, StopScheduled{response->step()});
    }
    Event(request.job_id(), absl::StrCat(CommandName(request.command()),
                                         " scheduled before step ", response->step()));
    Changed(it->second);
    return 0;
  });
  return response;
}

absl::StatusOr<std::shared_ptr<rendezvous::KeyValueStore>> Coordinator::Rendezvous(
    const std::string& session, const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  PT_ASSIGN_OR_RETURN(WorkerPool::Worker * caller, CallerLocked(session, ""));
  if (caller->info.job_id() != job_id) {
    return absl::PermissionDeniedError(
        absl::StrCat(caller->info.id(), " runs no rank of job ", job_id));
  }
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
  (void)FlushWrites();  // what was said so far
  auto stored = deps_.store->Events(id, after_seq, kEventsPerCall);
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
  return pool_.Infos();
}

absl::StatusOr<std::vector<StoredStep>> Coordinator::Steps(const std::string& id,
                                                           int64_t after_step) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!jobs_.count(id)) return absl::NotFoundError(absl::StrCat("no job ", id));
  }
  (void)FlushWrites();  // what was committed so far
  return deps_.store->Steps(id, after_step, kStepsPerCall);
}

absl::StatusOr<v1::RegisterWorkerResponse> Coordinator::Register(
    const v1::RegisterWorkerRequest& request) {
  if (request.address().empty()) {
    return absl::InvalidArgumentError("address: the worker's service address is required");
  }
  if (request.address().size() > 256 || request.device().size() > 64 ||
      request.name().size() > 256 || request.memory_bytes() < 0 || request.cores() < 0 ||
      request.cores() > kMaxWorkerCores) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a worker's address and name are at most 256 bytes, its device 64, its memory >= 0, "
        "its cores in [0, ", kMaxWorkerCores, "]"));
  }
  if (!IsServiceAddress(request.address())) {
    return absl::InvalidArgumentError(
        "address: expected the worker's service as host:port (a name, an IPv4 address or "
        "[IPv6]) with a port in 1..65535");
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
    std::lock_guard<std::mutex> lock(mu_);
    if (WorkerPool::Worker* old = pool_.FindByAddress(request.address());
        old != nullptr && old->info.state() != "lost") {
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
      deps_.connect(request.address(), request.command_key());
  if (!client.ok()) return client.status();
  // Numbered in the store: a worker still known by its id from before a restart must not
  // find that id given to another (its heartbeats would pass for the other's).
  absl::StatusOr<int64_t> number = deps_.store->Increment("worker");
  if (!number.ok()) {
    std::fprintf(stderr, "coordinator: %s\n", std::string(number.status().message()).c_str());
  }
  return LockedThenFlush([&]() -> absl::StatusOr<v1::RegisterWorkerResponse> {
    if (WorkerPool::Worker* old = pool_.FindByAddress(request.address())) {
      // The same service address again, where the old worker no longer answers: it restarted
      // (on a fixed port). One that registered meanwhile and was not asked is refused.
      const std::string old_id = old->info.id();
      if (old->info.state() != "lost" && old_id != holder_id) {
        return absl::AbortedError(absl::StrCat("address ", request.address(),
                                               " was just taken by ", old_id, "; try again"));
      }
      if (old->info.state() != "lost") {
        LoseWorker(*old, "registered again: it restarted (the old process no longer answers)");
      }
      pool_.Remove(old_id);
    }
    next_worker_ = std::max(next_worker_ + 1, number.ok() ? *number : int64_t{0});
    v1::WorkerInfo info;
    info.set_id(absl::StrFormat("worker-%d", next_worker_));
    info.set_address(request.address());
    info.set_device(request.device().empty() ? "cpu" : request.device());
    info.set_memory_bytes(request.memory_bytes());
    info.set_cores(request.cores());
    const std::string session = rpc::RandomKey();
    pool_.Add(info, *client, session, deps_.clock->Now());
    v1::RegisterWorkerResponse response;
    response.set_worker_id(info.id());
    response.set_session(session);
    response.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
    std::fprintf(stderr, "coordinator: %s registered (%s, %s%s%s)\n", info.id().c_str(),
                 request.address().c_str(), info.device().c_str(),
                 request.name().empty() ? "" : ", ", request.name().c_str());
    Schedule();
    return response;
  });
}

absl::Status Coordinator::Deregister(const std::string& session,
                                     const v1::DeregisterWorkerRequest& request) {
  return LockedThenFlush([&]() -> absl::Status {
    PT_ASSIGN_OR_RETURN(WorkerPool::Worker * w, CallerLocked(session, request.worker_id()));
    const std::string id = w->info.id();
    if (!w->info.job_id().empty()) LoseWorker(*w, "stopped (it was shut down)");
    std::fprintf(stderr, "coordinator: %s left (deregistered)\n", id.c_str());
    pool_.Remove(id);
    Schedule();
    return absl::OkStatus();
  });
}

absl::Status Coordinator::Heartbeat(const std::string& session,
                                    const v1::HeartbeatRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::StatusOr<WorkerPool::Worker*> caller = CallerLocked(session, request.worker_id());
  if (!caller.ok()) return caller.status();
  if (request.action().size() > 64 || request.waiting_for().size() > 64) {
    return absl::InvalidArgumentError("action and waiting_for are at most 64 bytes");
  }
  absl::StatusOr<WorkerPool::Worker*> worker =
      pool_.Heartbeat((*caller)->info.id(), deps_.clock->Now());
  if (!worker.ok()) return worker.status();
  if (request.job_id().empty()) return absl::OkStatus();
  auto j = jobs_.find(request.job_id());
  const bool rank_known = j != jobs_.end() && request.rank() >= 0 &&
                          request.rank() < static_cast<int>(j->second.run.rank_ended.size());
  const bool stale = j != jobs_.end() && request.generation() != 0 &&
                     request.generation() != j->second.job.generation();
  if (j == jobs_.end() || stale ||
      (j->second.job.state() != v1::JOB_STATE_RUNNING &&
       !(rank_known && j->second.run.rank_ended[request.rank()]))) {
    // Its stage outlived its job (a stop that reached the worker before the assignment,
    // a job ended while it was unreachable): stop it again, or it would hold the worker.
    std::shared_ptr<WorkerClient> client = (*worker)->client;
    v1::StopStageRequest stop;
    stop.set_job_id(request.job_id());
    stop.set_generation(request.generation());
    stop.set_reason(stale ? absl::StrCat("generation ", request.generation(), " of job ",
                                         request.job_id(), " has ended")
                          : absl::StrCat("job ", request.job_id(), " is no longer running"));
    Later([client, stop] { (void)client->StopStage(stop); });
  }
  // Its stage's activity, only for the rank it runs.
  if (j != jobs_.end() && !stale && request.rank() >= 0 &&
      request.rank() < j->second.job.stage_status_size() &&
      j->second.rank_worker[request.rank()] == (*worker)->info.id()) {
    v1::StageStatus* st = j->second.job.mutable_stage_status(request.rank());
    if (st->action() != request.action() || st->waiting_for() != request.waiting_for()) {
      st->set_action(request.action());
      st->set_waiting_for(request.waiting_for());
      ++j->second.version;
      changed_.notify_all();
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::DrainWorkerResponse> Coordinator::DrainWorker(
    const std::string& session, const v1::DrainWorkerRequest& request) {
  v1::DrainWorkerResponse response;
  std::shared_ptr<WorkerClient> rank0;
  std::string worker_id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    PT_ASSIGN_OR_RETURN(WorkerPool::Worker * w, CallerLocked(session, request.worker_id()));
    pool_.MarkDraining(*w);
    worker_id = w->info.id();
    auto j = jobs_.find(w->info.job_id());
    if (j == jobs_.end()) return response;
    JobEntry& e = j->second;
    response.set_job_id(e.job.id());
    if (e.job.state() != v1::JOB_STATE_RUNNING || e.run.phase == Phase::kRecovering ||
        e.job.restarts() >= e.config.max_restarts || w->generation != e.job.generation() ||
        e.rank_worker.empty()) {
      return response;  // nothing to restart: its rank ends with it
    }
    if (e.drain_step > 0) {  // another worker's drain already asked for one
      response.set_checkpoint_step(e.drain_step);
      return response;
    }
    WorkerPool::Worker* first = pool_.Find(e.rank_worker[0]);
    if (first == nullptr || first->info.state() == "lost") return response;
    rank0 = first->client;
  }
  v1::SendCommandRequest command;
  command.set_job_id(response.job_id());
  command.set_command(v1::STEP_COMMAND_CHECKPOINT);
  absl::StatusOr<v1::SendCommandResponse> scheduled = rank0->ScheduleCommand(command);
  if (!scheduled.ok()) return response;  // stops at once; the job restarts from an older one
  return LockedThenFlush([&]() -> absl::StatusOr<v1::DrainWorkerResponse> {
    auto j = jobs_.find(response.job_id());
    if (j == jobs_.end() || j->second.run.phase == Phase::kRecovering) return response;
    JobEntry& e = j->second;
    e.draining_worker = worker_id;
    e.drain_step = scheduled->step();
    response.set_checkpoint_step(scheduled->step());
    Event(e.job.id(), absl::StrCat(worker_id, " is stopping (drained): checkpoint scheduled before "
                                   "step ", scheduled->step(), "; the job restarts from it "
                                   "without this worker"));
    Changed(e);
    return response;
  });
}

int Coordinator::CheckpointRunningJobs(absl::Duration limit) {
  const absl::Time deadline = absl::Now() + limit;
  std::vector<std::pair<std::string, std::shared_ptr<WorkerClient>>> targets;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, e] : jobs_) {
      if (e.job.state() != v1::JOB_STATE_RUNNING || e.run.phase == Phase::kRecovering ||
          e.job.restarts() >= e.config.max_restarts || e.rank_worker.empty()) {
        continue;
      }
      WorkerPool::Worker* first = pool_.Find(e.rank_worker[0]);
      if (first != nullptr && first->info.state() != "lost") targets.push_back({id, first->client});
    }
  }
  std::map<std::string, int64_t> wanted;  // job -> checkpoint step
  for (const auto& target : targets) {
    const std::string& id = target.first;
    const std::shared_ptr<WorkerClient>& client = target.second;
    v1::SendCommandRequest command;
    command.set_job_id(id);
    command.set_command(v1::STEP_COMMAND_CHECKPOINT);
    absl::StatusOr<v1::SendCommandResponse> scheduled = client->ScheduleCommand(command);
    if (!scheduled.ok()) continue;
    wanted[id] = scheduled->step();
    LockedThenFlush([&] {
      Event(id, absl::StrCat("the coordinator is stopping: checkpoint scheduled before step ",
                             scheduled->step(), "; the job resumes from it when the "
                             "coordinator starts again"));
      return 0;
    });
  }
  std::unique_lock<std::mutex> lock(mu_);
  int done = 0;
  while (true) {
    done = 0;
    for (const auto& [id, step] : wanted) {
      const JobEntry& e = jobs_.at(id);
      if (e.job.checkpoint_step() >= step || e.job.state() != v1::JOB_STATE_RUNNING) ++done;
    }
    if (done == static_cast<int>(wanted.size()) || absl::Now() >= deadline) break;
    changed_.wait_for(lock, std::chrono::milliseconds(50));
  }
  lock.unlock();
  (void)FlushWrites();  // the records naming the checkpoints are durable before the exit
  return done;
}

absl::StatusOr<WorkerPool::Worker*> Coordinator::CallerLocked(const std::string& session,
                                                              const std::string& worker_id) {
  WorkerPool::Worker* w = pool_.FindBySession(session);
  if (w == nullptr) {
    return absl::NotFoundError(
        session.empty() ? "no worker session: register first"
                        : "unknown worker session (the coordinator restarted?): register again");
  }
  if (!worker_id.empty() && worker_id != w->info.id()) {
    return absl::PermissionDeniedError(absl::StrCat("the session of ", w->info.id(),
                                                    " cannot speak for ", worker_id));
  }
  return w;
}

absl::StatusOr<std::vector<const v1::StepReport*>> Coordinator::CheckReportsLocked(
    const std::string& session, const v1::StepReports& reports) {
  std::vector<const v1::StepReport*> apply;
  std::map<std::pair<std::string, int>, int64_t> last;  // (job, rank) -> last step so far
  for (const v1::StepReport& r : reports.reports()) {
    PT_ASSIGN_OR_RETURN(WorkerPool::Worker * caller, CallerLocked(session, r.worker_id()));
    auto it = jobs_.find(r.job_id());
    if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", r.job_id()));
    const JobEntry& e = it->second;
    if (e.job.state() != v1::JOB_STATE_RUNNING) {
      apply.push_back(&r);  // answered with stop
      continue;
    }
    if (e.run.phase == Phase::kRecovering ||
        (r.generation() != 0 && r.generation() != e.job.generation())) {
      continue;  // an earlier generation's: its stage is being stopped
    }
    const std::string where = absl::StrCat("job ", r.job_id(), " rank ", r.rank());
    if (r.rank() < 0 || r.rank() >= static_cast<int>(e.rank_worker.size())) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": no such rank"));
    }
    if (e.rank_worker[r.rank()] != caller->info.id()) {
      return absl::PermissionDeniedError(
          absl::StrCat(where, " runs on ", e.rank_worker[r.rank()], ", not ", caller->info.id()));
    }
    auto [seen, fresh] = last.emplace(std::make_pair(r.job_id(), r.rank()),
                                      e.ledger.last_step(r.rank()));
    const StepLedger::Order order = e.ledger.Expects(seen->second, r.step());
    if (order == StepLedger::Order::kResent) continue;  // counted already
    if (order == StepLedger::Order::kOutOfOrder || r.step() < 0 || r.step() >= e.job.steps()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": step ", r.step(), " reported, expected step ", seen->second + 1, " of ",
          e.job.steps(), " (steps are reported in order)"));
    }
    PT_RETURN_IF_ERROR(CheckStepReportFields(r, e.job.stages(), where));
    seen->second = r.step();
    apply.push_back(&r);
  }
  return apply;
}

absl::StatusOr<v1::ReportResponse> Coordinator::ReportSteps(const std::string& session,
                                                            const v1::StepReports& reports) {
  return LockedThenFlush([&]() -> absl::StatusOr<v1::ReportResponse> {
    PT_ASSIGN_OR_RETURN(std::vector<const v1::StepReport*> apply,
                        CheckReportsLocked(session, reports));
    v1::ReportResponse response;
    for (const v1::StepReport* r : apply) {
      absl::StatusOr<v1::ReportResponse> one = ReportStepLocked(*r);
      if (!one.ok()) return one.status();
      if (one->stop()) response.set_stop(true);
    }
    return response;
  });
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
  // An earlier report of this batch ended the generation.
  if (e.run.phase == Phase::kRecovering) return response;
  if (r.rank() < 0 || r.rank() >= e.job.stage_status_size()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", r.rank(), " out of range"));
  }
  if (!r.checkpoint_committed().empty() && r.step() + 1 > e.job.checkpoint_step()) {
    // The job restarts from it once every step before it is committed here too (below).
    e.reported_checkpoint = {r.step() + 1, r.checkpoint_committed()};
  }
  v1::StageStatus* st = e.job.mutable_stage_status(r.rank());
  st->set_step(r.step());
  st->set_compute_s(r.compute_s());
  st->set_wait_s(r.wait_s());
  st->set_parameter_bytes(r.parameter_bytes());
  st->set_peak_memory_bytes(r.peak_memory_bytes());
  st->set_peak_tensor_bytes(r.peak_tensor_bytes());
  *st->mutable_breakdown() = r.breakdown();
  st->set_state("running");
  const StepLedger::Recorded recorded = e.ledger.Record(r);
  e.job.set_step(e.ledger.committed());
  for (size_t s = 0; s < recorded.straggler_ratios.size(); ++s) {
    e.job.mutable_stage_status(recorded.replica_first_rank + static_cast<int>(s))
        ->set_straggler_ratio(recorded.straggler_ratios[s]);
  }
  if (recorded.tokens_per_s) e.job.set_tokens_per_s(*recorded.tokens_per_s);
  if (!r.resumed_from().empty() && r.rank() == 0) {
    e.job.set_resumed_from(r.resumed_from().substr(0, 4096));
    e.job.clear_checkpoints_passed_over();
    for (int i = 0; i < r.passed_over_size() && i < 16; ++i) {
      const std::string why = r.passed_over(i).substr(0, kMaxErrorBytes);
      *e.job.add_checkpoints_passed_over() = why;
      Event(e.job.id(), absl::StrCat("resuming: passed over ", why));
    }
    Event(e.job.id(), absl::StrCat("resumed from ", e.job.resumed_from(),
                                   r.passed_over_size() > 0
                                       ? absl::StrCat(" (", r.passed_over_size(),
                                                      " newer checkpoint(s) passed over)")
                                       : std::string()));
  }
  if (!r.checkpoint_failed().empty()) {
    Event(e.job.id(), absl::StrCat("checkpoint before step ", r.step() + 1, " failed on ",
                                   Rank(e.job, r.rank()), ": ",
                                   r.checkpoint_failed().substr(0, kMaxErrorBytes),
                                   " (the job goes on; its restart point stays at step ",
                                   e.job.checkpoint_step(), ")"));
  }
  if (r.skipped() && r.rank() == 0) {  // every rank skips it; rank 0 counts it
    e.job.set_skipped_steps(e.job.skipped_steps() + 1);
    Event(e.job.id(), absl::StrCat("step ", r.step(), " skipped: its loss or gradients were "
                                   "not finite (weights and optimizer state unchanged)"));
  }
  if (r.commands_after_size() > 0 &&
      ++e.command_reports[r.step() + 1] == e.job.stage_status_size()) {
    uint32_t bits = 0;
    for (int c : r.commands_after()) bits |= jobspec::StepCommandBit(static_cast<v1::StepCommand>(c));
    Event(e.job.id(), absl::StrCat(control::StepCommandsName(bits), " took effect before step ",
                                   r.step() + 1, " on all ", e.job.stage_status_size(),
                                   " ranks"));
  }
  if (!recorded.committed.empty()) {
    // The loss of a step is known once every replica's last stage reported it. The step is
    // committed: its row (replacing one an earlier generation wrote) goes to the store.
    for (const StepLedger::CommittedStep& step : recorded.committed) {
      StoredStep row;
      row.step = step.step;
      row.generation = e.job.generation();
      row.unix_ms = NowMs();
      if (step.loss) {
        e.job.set_loss(*step.loss);
        row.has_loss = true;
        row.loss = *step.loss;
      }
      e.unwritten_steps.push_back(row);
    }
    const int64_t done = e.job.step();
    if (e.reported_checkpoint.first > e.job.checkpoint_step() &&
        done >= e.reported_checkpoint.first - 1) {
      // Written at once, with the rows of the steps before it (FlushWrites writes steps
      // first): a restart finds every step before the checkpoint it resumes from.
      e.job.set_checkpoint_step(e.reported_checkpoint.first);
      e.job.set_checkpoint_path(e.reported_checkpoint.second);
      Event(e.job.id(), absl::StrCat("checkpoint before step ", e.job.checkpoint_step(),
                                     " committed: ", e.job.checkpoint_path()));
      Changed(e);
      if (e.drain_step > 0 && e.job.checkpoint_step() >= e.drain_step) {
        WorkerPool::Worker* w = pool_.Find(e.draining_worker);
        ApplyEvent(e, Fault{absl::StrCat(e.draining_worker, " (",
                                         w != nullptr ? w->info.address() : std::string("?"),
                                         ") was stopped (drained) after the checkpoint before "
                                         "step ", e.drain_step)});
        return response;
      }
    }
    if (e.job.recoveries_size() > 0 &&
        e.job.recoveries(e.job.recoveries_size() - 1).generation() == e.job.generation() &&
        e.job.recoveries(e.job.recoveries_size() - 1).first_step_unix_ms() == 0) {
      v1::Recovery* rec = e.job.mutable_recoveries(e.job.recoveries_size() - 1);
      rec->set_first_step_unix_ms(NowMs());
      Event(e.job.id(), absl::StrFormat(
                            "generation %d: step %d done by every rank, %.2f s after the fault "
                            "(placed after %.2f s)",
                            e.job.generation(), done, (rec->first_step_unix_ms() - rec->detected_unix_ms()) / 1e3,
                            (rec->placed_unix_ms() - rec->detected_unix_ms()) / 1e3));
      Changed(e);
    }
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

absl::StatusOr<v1::ReportResponse> Coordinator::ReportStageEnd(const std::string& session,
                                                               const v1::StageEnd& end) {
  return LockedThenFlush([&]() -> absl::StatusOr<v1::ReportResponse> {
    PT_ASSIGN_OR_RETURN(WorkerPool::Worker * caller, CallerLocked(session, end.worker_id()));
    auto it = jobs_.find(end.job_id());
    if (it != jobs_.end() && end.generation() != 0 && end.generation() != it->second.job.generation()) {
      // An earlier generation's rank has ended: its worker is free (PlaceRecovering waits
      // for that); the job is not touched.
      if (caller->info.job_id() == end.job_id() && caller->generation == end.generation()) {
        pool_.Release(*caller);
      }
      Schedule();
      return v1::ReportResponse();
    }
    if (it != jobs_.end() && end.rank() >= 0 &&
        end.rank() < static_cast<int>(it->second.rank_worker.size()) &&
        it->second.rank_worker[end.rank()] != caller->info.id()) {
      return absl::PermissionDeniedError(absl::StrCat("job ", end.job_id(), " rank ", end.rank(),
                                                      " runs on ", it->second.rank_worker[end.rank()],
                                                      ", not ", caller->info.id()));
    }
    if (end.error().size() <= kMaxErrorBytes) return StageEndLocked(end);
    v1::StageEnd cut = end;  // a cause is kept to its first kMaxErrorBytes
    cut.set_error(absl::StrCat(end.error().substr(0, kMaxErrorBytes), "..."));
    return StageEndLocked(cut);
  });
}

absl::StatusOr<v1::ReportResponse> Coordinator::StageEndLocked(const v1::StageEnd& end) {
  v1::ReportResponse response;
  WorkerPool::Worker* w = pool_.Find(end.worker_id());
  auto it = jobs_.find(end.job_id());
  if (w != nullptr && w->info.job_id() == end.job_id() &&
      (it == jobs_.end() || w->generation == it->second.job.generation())) {
    pool_.Release(*w);
  }
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", end.job_id()));
  JobEntry& e = it->second;
  StageEnded ended;
  ended.rank = end.rank();
  ended.ok = end.ok();
  ended.failed_after_peer = end.failed_after_peer();
  ended.failure = absl::StrCat(Rank(e.job, end.rank()), " on ", end.worker_id(), " failed: ",
                               end.error());
  ended.at = deps_.clock->Now();
  ApplyEvent(e, ended);
  Schedule();
  return response;
}

void Coordinator::ApplyEvent(JobEntry& e, const JobEvent& event) {
  const JobRun before = e.run;
  Transition t = Apply(e.run, event, RestartPolicy{e.config.max_restarts});
  e.run = std::move(t.run);
  e.job.set_state(JobStateOf(e.run.phase));
  e.job.set_restarts(e.run.restarts);
  e.job.set_generation(e.run.generation);
  for (const JobCommand& command : t.commands) {
    if (const auto* stop = std::get_if<StopRanks>(&command)) {
      SendStops(e, stop->ranks, stop->reason);
    } else if (const auto* mark = std::get_if<MarkStage>(&command)) {
      v1::StageStatus* st = e.job.mutable_stage_status(mark->rank);
      if (mark->mark == StageMark::kLost) {
        st->set_state("lost");
      } else {
        st->set_state(mark->mark == StageMark::kDone ? "done" : "failed");
        st->set_action("");
        st->set_waiting_for("");
      }
    } else if (const auto* say = std::get_if<Announce>(&command)) {
      Event(e.job.id(), say->text);
    } else if (const auto* recover = std::get_if<BeginRecovery>(&command)) {
      RecordRecovery(e, recover->cause);
    } else if (const auto* end = std::get_if<EndJob>(&command)) {
      RecordEnd(e, end->message);
    } else if (const auto* requeue = std::get_if<Requeue>(&command)) {
      ReturnToQueue(e, requeue->why);
    }
  }
  if (!t.commands.empty() || e.run.phase != before.phase || e.run.stop_step != before.stop_step ||
      e.run.generation != before.generation) {
    Changed(e);
  }
}

void Coordinator::RecordEnd(JobEntry& e, const std::string& message) {
  e.job.set_message(message);
  e.job.set_finished_unix_ms(NowMs());
  if (e.run.phase == Phase::kSucceeded) {
    Event(e.job.id(), absl::StrFormat("succeeded: %d steps, final loss %.4f, %.1f s",
                                      e.job.steps(), e.job.loss(),
                                      (e.job.finished_unix_ms() - e.job.started_unix_ms()) / 1e3));
  } else {
    Event(e.job.id(), absl::StrCat(e.run.phase == Phase::kCancelled ? "cancelled" : "failed",
                                   ": ", message));
  }
  e.store.reset();
}

void Coordinator::SendStops(JobEntry& e, const std::vector<int>& ranks,
                            const std::string& reason) {
  for (int r : ranks) {
    if (r < 0 || r >= static_cast<int>(e.rank_worker.size())) continue;
    WorkerPool::Worker* w = pool_.Find(e.rank_worker[r]);
    if (w == nullptr || w->info.state() == "lost") continue;
    std::shared_ptr<WorkerClient> client = w->client;
    v1::StopStageRequest request;
    request.set_job_id(e.job.id());
    request.set_generation(e.job.generation());
    request.set_reason(reason);
    Later([client, request] { (void)client->StopStage(request); });
  }
}

void Coordinator::RecordRecovery(JobEntry& e, const std::string& cause) {
  e.recovering_since = deps_.clock->Now();
  e.store.reset();
  for (auto& st : *e.job.mutable_stage_status()) {
    if (st.state() != "done" && st.state() != "failed" && st.state() != "lost") {
      st.set_state("stopping");
    }
  }
  const int64_t resume_at = e.job.checkpoint_step();
  v1::Recovery* rec = e.job.add_recoveries();
  rec->set_generation(e.job.generation() + 1);
  rec->set_cause(cause.substr(0, kMaxErrorBytes));
  rec->set_failed_after_step(e.job.step());
  rec->set_resumed_at_step(resume_at);
  rec->set_detected_unix_ms(NowMs());
  const int64_t again = std::max<int64_t>(0, e.job.step() + 1 - resume_at);
  e.job.set_message(absl::StrCat("recovering (restart ", e.job.restarts(), " of ",
                                 e.config.max_restarts, "): ", cause));
  Event(e.job.id(),
        absl::StrCat("generation ", e.job.generation(), " ended: ", cause, "; restart ",
                     e.job.restarts(), " of ", e.config.max_restarts, " from ",
                     resume_at > 0 ? absl::StrCat("the checkpoint before step ", resume_at)
                                   : std::string("the start"),
                     " (", again, " step", again == 1 ? "" : "s", " to run again)"));
  // Steps after the checkpoint are run again, and committed again, by the next generation.
  e.job.set_step(resume_at - 1);
}

void Coordinator::StartGeneration(JobEntry& e, const std::vector<std::string>& rank_workers,
                                  v1::JobSpec run_spec, int64_t start_step) {
  const int ranks = static_cast<int>(rank_workers.size());
  ApplyEvent(e, GenerationStarted{ranks});
  e.run_spec = std::move(run_spec);
  e.store = rendezvous::MakeMemoryStore({kKvValueBytes, kKvJobBytes});
  e.job.clear_message();  // it no longer waits
  e.requeued_because.clear();
  if (e.job.started_unix_ms() == 0) e.job.set_started_unix_ms(NowMs());
  e.job.clear_stage_status();
  e.rank_worker = rank_workers;
  e.ledger = StepLedger(ranks, e.job.stages(), start_step, e.job.step(), e.tokens_per_step);
  e.assign_attempts.assign(ranks, 0);
  e.command_reports.clear();
  e.reported_checkpoint = {0, ""};
  e.draining_worker.clear();
  e.drain_step = 0;
  std::vector<std::string> placed;
  for (int r = 0; r < ranks; ++r) {
    pool_.Assign(*pool_.Find(rank_workers[r]), e.job.id(), r, e.job.generation());
    v1::StageStatus* st = e.job.add_stage_status();
    st->set_stage(r % e.job.stages());
    st->set_replica(r / e.job.stages());
    st->set_worker_id(rank_workers[r]);
    st->set_step(std::max<int64_t>(-1, start_step - 1));
    st->set_state("assigned");
    placed.push_back(absl::StrCat(Rank(e.job, r), " on ", rank_workers[r]));
    AssignRank(e.job.id(), r);
  }
  Event(e.job.id(), absl::StrCat(e.job.generation() > 1 ? absl::StrCat("generation ", e.job.generation(), " ")
                                                  : std::string(),
                                 "running: ", absl::StrJoin(placed, ", ")));
  Changed(e);
}

bool Coordinator::PlaceRecovering() {
  bool waiting = false;
  std::vector<JobEntry*> recovering;
  for (auto& [id, e] : jobs_) {
    if (e.run.phase == Phase::kRecovering) recovering.push_back(&e);
  }
  std::sort(recovering.begin(), recovering.end(),
            [](const JobEntry* a, const JobEntry* b) { return a->order < b->order; });
  const absl::Time now = deps_.clock->Now();
  for (JobEntry* e : recovering) {
    // Every rank of the last generation has ended (its worker reported it, or was lost).
    bool ending = false;
    for (const v1::WorkerInfo& w : pool_.Infos()) {
      if ((w.state() == "busy" || w.state() == "draining") && w.job_id() == e->job.id()) {
        ending = true;
      }
    }
    const int min_cores = e->config.threads_per_stage;
    std::vector<std::string> idle;
    for (const v1::WorkerInfo& w : pool_.Infos()) {
      if (w.state() == "idle" && DeviceKind(w.device()) == DeviceKind(e->config.device) &&
          (min_cores <= 0 || w.cores() <= 0 || w.cores() >= min_cores)) {
        idle.push_back(w.id());
      }
    }
    const v1::JobSpec& spec = e->job.spec();
    const job::JobConfig& c = e->config;
    const Layout original{job::PipelineStages(c), c.replicas, c.micro_batches};
    const bool full = static_cast<int>(idle.size()) >= original.stages * original.replicas;
    const bool grace_over = now - e->recovering_since >= 3 * options_.heartbeat_interval;
    std::optional<std::pair<Layout, v1::JobSpec>> chosen;
    std::vector<std::string> chosen_workers;
    std::string too_small;  // why layouts were passed over, for the job's message
    if (!ending && (full || grace_over)) {
      for (const Layout& l : RecoveryLayouts(original, static_cast<int>(idle.size()),
                                             spec.stage_ranges_size() > 0)) {
        // Only workers whose memory holds a rank's parameter state (when both are known).
        const std::optional<int64_t> need = RankParameterStateBytes(c, l);
        std::vector<std::string> fit;
        for (const std::string& id : idle) {
          const int64_t memory = pool_.Find(id)->info.memory_bytes();
          if (!need || memory <= 0 || memory >= *need) fit.push_back(id);
        }
        if (static_cast<int>(fit.size()) < l.stages * l.replicas) {
          too_small = absl::StrCat("; ", l.stages, " stages x ", l.replicas, " replicas need ",
                                   l.stages * l.replicas, " workers with ", need.value_or(0),
                                   " bytes for a rank's parameters, gradients and optimizer "
                                   "state, ", fit.size(), " idle have them");
          continue;
        }
        v1::JobSpec run = spec;
        if (l.stages != original.stages) {
          run.clear_stage_ranges();
          run.set_stages(l.stages);
        }
        run.set_replicas(l.replicas);
        run.set_microbatches(l.micro_batches);
        if (e->job.checkpoint_step() > 0) run.set_resume_from(e->job.checkpoint_path());
        if (jobspec::JobConfigFromSpec(run).ok()) {
          chosen.emplace(l, std::move(run));
          chosen_workers = fit;
          break;
        }
      }
    }
    if (!chosen) {
      const absl::Duration limit = absl::Seconds(c.recv_timeout_s);
      if (now - e->recovering_since > limit) {
        ApplyEvent(*e, RecoveryTimedOut{
               absl::StrCat("no workers to restart on within timeout_s (",
                            absl::FormatDuration(limit), "): ", idle.size(), " idle",
                            ending ? ", ranks of the last generation still ending" : "",
                            too_small,
                            "; it ran ", e->job.step() + 1, " of ", e->job.steps(),
                            " steps; the last fault: ", e->job.recoveries().empty()
                                ? std::string("?")
                                : e->job.recoveries(e->job.recoveries_size() - 1).cause())});
        continue;
      }
      // Why it waits, in `status` (and, when it changes, its events).
      const std::string why = absl::StrCat(
          "recovering (restart ", e->job.restarts(), " of ", c.max_restarts, "): ",
          e->job.recoveries().empty()
              ? std::string("?")
              : e->job.recoveries(e->job.recoveries_size() - 1).cause(),
          "; waits for workers to restart on: ", idle.size(), " idle",
          ending ? ", ranks of the last generation still ending" : "",
          !grace_over && !ending ? ", the same layout for 3 heartbeats" : "", too_small,
          "; up to timeout_s (", absl::FormatDuration(limit), ") in all");
      if (e->job.message() != why) {
        // An event when it starts waiting; `status` follows every change of the counts.
        if (!absl::StrContains(e->job.message(), "; waits for workers to restart on: ")) {
          Event(e->job.id(), why);
        }
        e->job.set_message(why);
        Changed(*e);
      }
      // The idle workers are kept for it only while it is about to take them (its old ranks
      // ending, or the grace for its own layout); after that it holds none it cannot use,
      // and queued jobs start on them.
      if (ending || !grace_over) waiting = true;
      continue;
    }
    const auto& [layout, run] = *chosen;
    e->job.set_stages(layout.stages);
    e->job.set_replicas(layout.replicas);
    v1::Recovery* rec = e->job.mutable_recoveries(e->job.recoveries_size() - 1);
    rec->set_stages(layout.stages);
    rec->set_replicas(layout.replicas);
    rec->set_microbatches(layout.micro_batches);
    rec->set_placed_unix_ms(NowMs());
    if (layout.stages != original.stages || layout.replicas != original.replicas) {
      Event(e->job.id(), absl::StrCat("only ", idle.size(), " workers: generation ",
                                      e->job.generation() + 1, " runs ", layout.stages, " stages x ",
                                      layout.replicas, " replicas x ", layout.micro_batches,
                                      " micro-batches (the global batch unchanged)"));
    }
    const int ranks = layout.stages * layout.replicas;
    StartGeneration(*e, std::vector<std::string>(chosen_workers.begin(),
                                                 chosen_workers.begin() + ranks), run,
                    e->job.checkpoint_step() > 0 ? e->job.checkpoint_step()
                                                 : (run.has_resume_from() ? -1 : 0));
  }
  return waiting;
}

void Coordinator::Schedule() {
  // A job recovering from a fault has the idle workers first; queued jobs wait while it is
  // about to take them (PlaceRecovering).
  if (PlaceRecovering()) return;
  std::vector<JobEntry*> queued;
  for (auto& [id, e] : jobs_) {
    if (e.job.state() == v1::JOB_STATE_QUEUED && e.durable) queued.push_back(&e);
  }
  std::sort(queued.begin(), queued.end(),
            [](const JobEntry* a, const JobEntry* b) { return a->order < b->order; });
  std::vector<QueuedJob> wanted;
  for (const JobEntry* e : queued) {
    wanted.push_back({e->job.id(), e->job.stages() * e->job.replicas(),
                      e->config.threads_per_stage, e->config.device});
  }
  std::vector<PoolWorker> pool;
  for (const v1::WorkerInfo& w : pool_.Infos()) {
    if (w.state() != "lost") {
      pool.push_back({w.id(), w.cores(), w.state() == "idle", w.device()});
    }
  }
  const PlacementPlan plan = PlaceQueuedJobs(wanted, pool);
  for (const Waiting& waiting : plan.waiting) {
    JobEntry& e = jobs_.at(waiting.job_id);
    const std::string reason = e.requeued_because.empty()
                                   ? waiting.reason
                                   : absl::StrCat(e.requeued_because, "; ", waiting.reason);
    if (e.job.message() == reason) continue;
    // Why it waits, in `status` and (when it changes) in its events.
    e.job.set_message(reason);
    Event(waiting.job_id, absl::StrCat("queued: ", waiting.reason));
    Changed(e);
  }
  for (const Placement& p : plan.started) {
    JobEntry& e = jobs_.at(p.job_id);
    StartGeneration(e, p.rank_workers, e.job.spec(), e.job.spec().has_resume_from() ? -1 : 0);
  }
}

void Coordinator::AssignRank(const std::string& job_id, int rank) {
  const JobEntry& e = jobs_.at(job_id);
  const std::string worker_id = e.rank_worker[rank];
  std::shared_ptr<WorkerClient> client = pool_.Find(worker_id)->client;
  v1::StageAssignment assignment;
  assignment.set_job_id(job_id);
  *assignment.mutable_spec() = e.run_spec;
  assignment.set_rank(rank);
  assignment.set_generation(e.job.generation());
  Later([this, client, assignment, worker_id] {
    absl::Status s = client->AssignStage(assignment);
    if (s.ok()) return;
    LockedThenFlush([&] {
      auto it = jobs_.find(assignment.job_id());
      if (it == jobs_.end() || it->second.job.generation() != assignment.generation()) return 0;
      AssignmentFailed(assignment.job_id(), assignment.rank(), worker_id, s);
      return 0;
    });
  });
}

void Coordinator::AssignmentFailed(const std::string& job_id, int rank,
                                   const std::string& worker_id, const absl::Status& error) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  JobEntry& e = it->second;
  // Only the running generation's (one that ended, or a job that ended, is not touched).
  if (e.run.phase != Phase::kRunning && e.run.phase != Phase::kHeldFailure) return;
  if (e.rank_worker[rank] != worker_id) return;  // moved already
  const std::string failed = absl::StrCat("assigning ", Rank(e.job, rank), " to ", worker_id,
                                          " failed: ", error.message());
  WorkerPool::Worker* w = pool_.Find(worker_id);
  const bool unreachable = absl::IsUnavailable(error) || absl::IsDeadlineExceeded(error);
  if (w != nullptr) {
    if (unreachable) {
      pool_.MarkLost(*w, deps_.clock->Now());  // not chosen again until it registers again
    } else {
      pool_.Release(*w);
    }
  }
  std::vector<std::string> idle;  // of the job's device kind
  for (const std::string& id : pool_.IdleIds()) {
    if (DeviceKind(pool_.Find(id)->info.device()) == DeviceKind(e.config.device)) {
      idle.push_back(id);
    }
  }
  if (unreachable && !idle.empty() && ++e.assign_attempts[rank] < options_.assign_attempts) {
    const std::string next = idle.front();
    pool_.Assign(*pool_.Find(next), job_id, rank, e.job.generation());
    e.rank_worker[rank] = next;
    e.job.mutable_stage_status(rank)->set_worker_id(next);
    Event(job_id, absl::StrCat(failed, "; assigned to ", next, " instead"));
    Changed(e);
    AssignRank(job_id, rank);
    return;
  }
  if (unreachable) {
    // No worker to take the rank: a placement failure, not the job's. It waits in the queue
    // for workers, as a job that never started would (the unreachable one is lost until it
    // registers again), and costs no restart.
    ApplyEvent(e, Unplaceable{rank, failed});
  } else {
    ApplyEvent(e, Fault{failed, rank});
  }
  Schedule();
}

void Coordinator::ReturnToQueue(JobEntry& e, const std::string& why) {
  e.job.clear_stage_status();
  e.rank_worker.clear();
  e.store.reset();
  e.requeued_because = absl::StrCat("requeued: ", why);
  e.job.set_message(e.requeued_because);
  Event(e.job.id(), e.requeued_because);
  Changed(e);
}

void Coordinator::LoseWorker(WorkerPool::Worker& w, const std::string& why) {
  WorkerPool::Lost lost{w.info.id(), w.info.address(), w.info.job_id(), w.info.rank(),
                        absl::ZeroDuration(), w.generation};
  pool_.MarkLost(w, deps_.clock->Now());
  FailRankOf(lost, why);
}

void Coordinator::FailRankOf(const WorkerPool::Lost& lost, const std::string& why) {
  auto j = jobs_.find(lost.job_id);
  if (j == jobs_.end() || j->second.job.state() != v1::JOB_STATE_RUNNING) return;
  JobEntry& e = j->second;
  // A worker of an earlier generation, still ending its stage: nothing more to fail (the
  // recovering job no longer waits for it).
  if (e.run.phase == Phase::kRecovering ||
      (lost.generation != 0 && lost.generation != e.job.generation())) {
    return;
  }
  ApplyEvent(e, RankLost{lost.rank, absl::StrCat(lost.id, " (", lost.address, ") running ",
                                                 Rank(e.job, lost.rank), " ", why)});
}

void Coordinator::FailLostWorker(const WorkerPool::Lost& lost) {
  const std::string silent =
      absl::FormatDuration(absl::Trunc(lost.silent, absl::Milliseconds(1)));
  std::fprintf(stderr, "coordinator: %s (%s) lost: no heartbeat for %s\n", lost.id.c_str(),
               lost.address.c_str(), silent.c_str());
  FailRankOf(lost, absl::StrCat("stopped sending heartbeats (none for ", silent, ")"));
}

void Coordinator::TickLocked() {
  const absl::Time now = deps_.clock->Now();
  for (const std::string& id : pool_.RemoveLostFor(now, options_.lost_worker_ttl)) {
    std::fprintf(stderr, "coordinator: %s forgotten (lost for over %s)\n", id.c_str(),
                 absl::FormatDuration(options_.lost_worker_ttl).c_str());
  }
  for (const WorkerPool::Lost& lost : pool_.ExpireSilent(now, 2 * options_.heartbeat_interval)) {
    ++workers_lost_silent_;
    FailLostWorker(lost);
  }
  // A held-back rank failure becomes the job's once every worker of a rank still running
  // has heartbeated more than half an interval after it (so that a heartbeat sent before
  // a peer died, still on its way, does not count); a lost one ended the job above.
  for (auto& [id, e] : jobs_) {
    if (e.run.phase != Phase::kHeldFailure) continue;
    bool alive = true;
    for (size_t r = 0; r < e.rank_worker.size() && r < e.run.rank_ended.size(); ++r) {
      const WorkerPool::Worker* w = pool_.Find(e.rank_worker[r]);
      if (!e.run.rank_ended[r] && w != nullptr &&
          w->last_heartbeat <= e.run.held_since + options_.heartbeat_interval / 2) {
        alive = false;
      }
    }
    if (alive) ApplyEvent(e, PeersAlive{});
  }
  Schedule();
}

void Coordinator::Tick() {
  LockedThenFlush([&] {
    TickLocked();
    return 0;
  });
}

void Coordinator::Monitor() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    // Until the next worker is due to be lost (so that it is lost two intervals after its
    // last heartbeat, not up to a tick later), or a quarter interval at most.
    const absl::Duration wait = std::min(
        std::max(absl::Milliseconds(10), options_.heartbeat_interval / 4),
        pool_.NextExpiry(2 * options_.heartbeat_interval) + absl::Milliseconds(1) -
            deps_.clock->Now());
    // Woken early only to stop (job changes notify the same variable: they do not count).
    if (changed_.wait_for(lock,
                          std::chrono::microseconds(std::max<int64_t>(
                              1000, absl::ToInt64Microseconds(wait))),
                          [this] { return stopping_; })) {
      break;
    }
    TickLocked();
    lock.unlock();
    (void)FlushWrites();
    last_pass_ms_.store(absl::ToUnixMillis(deps_.clock->Now()));
    lock.lock();
  }
}

bool Coordinator::StateLoopLive() const {
  if (!monitor_.joinable()) return true;
  const absl::Time last = absl::FromUnixMillis(last_pass_ms_.load());
  return deps_.clock->Now() - last <= options_.stall_limit;
}

}  // namespace pipetrain::coordinator
