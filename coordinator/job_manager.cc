// The coordinator's JobService. See job_manager.h.
#include "coordinator/job_manager.h"

#include <algorithm>
#include <filesystem>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "jobspec/step_commands.h"
#include "proto/states.h"
#include "runtime/base/status_macros.h"
#include "runtime/control/step_commands.h"
#include "runtime/job/job_spec.h"
#include "runtime/weights/optimizer_config.h"

namespace pipetrain::coordinator {

JobManager::JobManager(CoordinatorState& state, Dispatcher& dispatcher)
    : state_(state),
      dispatcher_(dispatcher),
      planner_({state.options.planning_cpu_budget, state.options.planning_time_limit,
                state.options.planning_wait, state.options.host_links}) {}

const std::map<std::pair<std::string, std::string>, int64_t>& JobManager::command_counts() const {
  state_.mu.AssertHeld();
  return commands_.counts();
}

absl::Status JobManager::Load() {
  auto stored = state_.store->LoadJobs();
  if (!stored.ok()) return stored.status();
  {
    absl::MutexLock lock(&state_.mu);
    for (const StoredJob& s : *stored) {
      v1::Job job;
      if (!job.ParseFromString(s.job)) {
        return absl::DataLossError(absl::StrCat("job store: job ", s.id, " is unreadable"));
      }
      absl::StatusOr<job::JobSpec> config = job::Validated(job.spec());
      JobEntry& e = state_.jobs.Add(
          s.id, JobEntry(JobController::FromRecord(state_.JobSettings(), std::move(job), config)));
      e.durable = true;
      state_.Carry(e);
    }
  }
  if (absl::Status s = state_.FlushWrites(); !s.ok()) {
    std::fprintf(stderr, "coordinator: %s\n", std::string(s.message()).c_str());
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> JobManager::Submit(const v1::JobSpec& submitted,
                                           const std::string& model_profile_json) {
  v1::JobSpec spec = submitted;
  absl::StatusOr<job::JobSpec> config = job::Validated(spec);
  if (!config.ok()) return config.status();
  std::optional<v1::PlannedLayout> plan;
  if (config->auto_stages()) {
    std::vector<v1::WorkerInfo> workers;
    {
      absl::MutexLock lock(&state_.mu);
      workers = state_.pool.Infos();
    }
    absl::StatusOr<SubmissionPlanner::Planned> planned =
        planner_.Plan(spec, model_profile_json, workers);
    if (!planned.ok()) return planned.status();
    spec = planned->spec;
    plan = planned->record;
    config = job::Validated(spec);
    if (!config.ok()) {
      return absl::InternalError(
          absl::StrCat("the planned layout is invalid: ", config.status().message()));
    }
  }
  std::string id;
  {
    absl::MutexLock lock(&state_.mu);
    const std::string own_id = absl::StrFormat("job-%04d", state_.jobs.next_order() + 1);
    if (absl::Status s = PlaceCheckpointDir(own_id, spec, *config); !s.ok()) return s;
    v1::Job job;
    job.set_id(own_id);
    *job.mutable_spec() = spec;
    job.set_state(v1::JOB_STATE_QUEUED);
    job.set_stages(job::PipelineStages(*config));
    job.set_replicas(config->replicas());
    job.set_steps(config->steps());
    job.set_step(-1);
    job.set_submitted_unix_ms(state_.NowMs());
    if (plan) *job.mutable_plan() = *plan;
    const bool tokens = job::DataKindOf(*config) != "classification";
    job.set_data_unit(tokens ? "tok" : "samples");
    id = job.id();
    JobEntry& added =
        state_.jobs.Add(id, JobEntry(JobController(state_.JobSettings(), std::move(job), *config)));
    const v1::Job& j = added.controller.job();
    state_.jobs.Changed(added);
    state_.jobs.Event(
        id, absl::StrCat("submitted", j.spec().name().empty() ? "" : " as ", j.spec().name(), ": ",
                         j.stages(), " stages x ", j.replicas(), " replicas, ", j.steps(),
                         " steps; needs ", j.stages() * j.replicas(), " workers"));
    if (j.has_plan()) {
      state_.jobs.Event(id,
                        absl::StrFormat("planned by %s for %d workers: %s; predicted step %.2f ms",
                                        j.plan().planner(), j.plan().workers(), j.plan().layout(),
                                        j.plan().predicted_step_time_s() * 1e3));
    }
  }
  // Acknowledged only once durable; until then it is not scheduled.
  const absl::Status written = state_.FlushWrites();
  v1::Job job;
  {
    absl::MutexLock lock(&state_.mu);
    auto it = state_.jobs.find(id);
    if (!written.ok() && state_.writes.Discard(id)) {
      state_.jobs.Remove(id);
      return absl::UnavailableError(absl::StrCat("the job was not accepted: ", written.message()));
    }
    it->second.durable = true;
    dispatcher_.Schedule();
    job = it->second.controller.job();
  }
  (void)state_.FlushWrites();
  return job;
}

absl::Status JobManager::PlaceCheckpointDir(const std::string& id, v1::JobSpec& spec,
                                            job::JobSpec& config) const {
  if (!spec.checkpoint().has_dir()) {
    if (spec.resume_from() == "latest") {
      return absl::InvalidArgumentError(
          "resume_from: latest needs checkpoint.dir: under the coordinator a job without one "
          "keeps its checkpoints in a directory of its own (checkpoints/JOB-ID), where nothing "
          "is yet; name the directory to resume from");
    }
    const std::string own = "checkpoints/" + id;
    spec.mutable_checkpoint()->set_dir(own);
    config.mutable_checkpoint()->set_dir(own);
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
  for (const auto& [other_id, other] : state_.jobs) {
    const v1::JobState state = other.controller.job().state();
    if (state != v1::JOB_STATE_QUEUED && state != v1::JOB_STATE_RUNNING) continue;
    if (normal(other.controller.config().checkpoint().dir()) == dir) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint.dir ", spec.checkpoint().dir(), " holds the checkpoints of ", other_id, " (",
          state == v1::JOB_STATE_QUEUED ? "queued" : "running",
          "): a job's checkpoints never share a directory with another's; give this one its "
          "own, or none (then it gets checkpoints/",
          id, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> JobManager::Get(const std::string& id) {
  absl::StatusOr<v1::Job> job = [&]() -> absl::StatusOr<v1::Job> {
    absl::MutexLock lock(&state_.mu);
    auto it = state_.jobs.find(id);
    if (it == state_.jobs.end()) return absl::NotFoundError(absl::StrCat("no job ", id));
    return it->second.controller.job();
  }();
  (void)state_.FlushWrites();  // what a caller sees is durable (coordinator.h, Persistence)
  return job;
}

absl::StatusOr<v1::ListJobsResponse> JobManager::List(int page_size,
                                                      const std::string& page_token) {
  int64_t after = -1;  // the order of the last job of the previous page
  if (!page_token.empty() && (!absl::SimpleAtoi(page_token, &after) || after < 0)) {
    return absl::InvalidArgumentError("page_token: not one this coordinator gave");
  }
  const int limit = page_size <= 0 ? 100 : std::min(page_size, 500);
  v1::ListJobsResponse page = ListPage(after, limit);
  (void)state_.FlushWrites();  // what a caller sees is durable
  return page;
}

v1::ListJobsResponse JobManager::ListPage(int64_t after, int limit) {
  absl::MutexLock lock(&state_.mu);
  const std::vector<JobEntry*> entries =
      state_.jobs.InOrder([after](const JobEntry& e) { return e.order > after; });
  v1::ListJobsResponse page;
  size_t bytes = 0;
  int64_t last_order = after;
  for (const JobEntry* e : entries) {
    if (page.jobs_size() == limit || (page.jobs_size() > 0 && bytes >= kListPageBytes)) {
      page.set_next_page_token(absl::StrCat(last_order));  // more after this page
      break;
    }
    bytes += e->controller.job().ByteSizeLong();
    *page.add_jobs() = e->controller.job();
    last_order = e->order;
  }
  return page;
}

absl::StatusOr<v1::Job> JobManager::Cancel(const std::string& id) {
  StateLock lock(&state_);
  auto it = state_.jobs.find(id);
  if (it == state_.jobs.end()) return absl::NotFoundError(absl::StrCat("no job ", id));
  const v1::JobState state = it->second.controller.job().state();
  if (JobEnded(state)) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id, " already ended (", v1::JobState_Name(state), ")"));
  }
  it->second.controller.Apply(CancelRequested{});
  state_.Carry(it->second);
  dispatcher_.Schedule();
  return it->second.controller.job();
}

absl::StatusOr<v1::SendCommandResponse> JobManager::SendCommand(
    const v1::SendCommandRequest& request) {
  absl::StatusOr<v1::SendCommandResponse> response = SendCommandUncounted(request);
  absl::MutexLock lock(&state_.mu);
  commands_.Count(request.command(), response.status());
  return response;
}

absl::StatusOr<v1::SendCommandResponse> JobManager::SendCommandUncounted(
    const v1::SendCommandRequest& request) {
  std::shared_ptr<WorkerClient> client;
  {
    absl::MutexLock lock(&state_.mu);
    auto it = state_.jobs.find(request.job_id());
    if (it == state_.jobs.end())
      return absl::NotFoundError(absl::StrCat("no job ", request.job_id()));
    const JobController& c = it->second.controller;
    if (jobspec::StepCommandBit(request.command()) == 0) {
      return absl::InvalidArgumentError("command: give flush, switch, checkpoint or stop");
    }
    PT_ASSIGN_OR_RETURN(client,
                        CommandRelay::Rank0(c.job(), c.phase(), c.rank_worker(), state_.pool));
  }
  absl::StatusOr<int64_t> boundary =
      CommandRelay::Send(*client, request.job_id(), request.command(), request.step());
  if (!boundary.ok()) return boundary.status();
  v1::SendCommandResponse response;
  response.set_step(*boundary);
  StateLock lock(&state_);
  auto it = state_.jobs.find(request.job_id());
  if (it == state_.jobs.end()) return response;
  it->second.controller.CommandScheduled(request.command(), StepCommandName(request.command()),
                                         *boundary);
  state_.Carry(it->second);
  return response;
}

absl::StatusOr<std::pair<v1::Job, int64_t>> JobManager::WaitForChange(const std::string& id,
                                                                      int64_t version,
                                                                      absl::Time deadline) {
  absl::StatusOr<std::pair<v1::Job, int64_t>> changed =
      [&]() -> absl::StatusOr<std::pair<v1::Job, int64_t>> {
    absl::MutexLock lock(&state_.mu);
    while (true) {
      auto it = state_.jobs.find(id);
      if (it == state_.jobs.end()) return absl::NotFoundError(absl::StrCat("no job ", id));
      if (it->second.version != version || state_.stopping || absl::Now() >= deadline) {
        return std::make_pair(it->second.controller.job(), it->second.version);
      }
      state_.changed.WaitWithDeadline(&state_.mu, deadline);
    }
  }();
  (void)state_.FlushWrites();  // what a caller sees is durable
  return changed;
}

absl::StatusOr<std::vector<v1::JobEvent>> JobManager::Events(const std::string& id,
                                                             int64_t after_seq) {
  {
    absl::MutexLock lock(&state_.mu);
    if (!state_.jobs.contains(id)) return absl::NotFoundError(absl::StrCat("no job ", id));
  }
  (void)state_.FlushWrites();  // what was said so far
  auto stored = state_.store->Events(id, after_seq, kEventsPerCall);
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

absl::StatusOr<std::vector<StoredStep>> JobManager::Steps(const std::string& id,
                                                          int64_t after_step) {
  weights::OptimizerConfig optimizer;
  int64_t job_steps = 0;
  {
    absl::MutexLock lock(&state_.mu);
    auto it = state_.jobs.find(id);
    if (it == state_.jobs.end()) return absl::NotFoundError(absl::StrCat("no job ", id));
    optimizer = job::OptimizerConfigOf(it->second.controller.config());
    job_steps = it->second.controller.config().steps();
  }
  (void)state_.FlushWrites();  // what was committed so far
  PT_ASSIGN_OR_RETURN(std::vector<StoredStep> steps,
                      state_.store->Steps(id, after_step, kStepsPerCall));
  for (StoredStep& step : steps) {
    step.learning_rate = weights::LearningRateAt(optimizer, step.step, job_steps);
  }
  return steps;
}

int JobManager::CheckpointRunningJobs(absl::Duration limit) {
  const absl::Time deadline = absl::Now() + limit;
  std::vector<std::pair<std::string, std::shared_ptr<WorkerClient>>> targets;
  {
    absl::MutexLock lock(&state_.mu);
    for (auto& [id, e] : state_.jobs) {
      const JobController& c = e.controller;
      if (c.job().restarts() >= c.config().max_restarts()) continue;  // it could not resume
      absl::StatusOr<std::shared_ptr<WorkerClient>> rank0 =
          CommandRelay::Rank0(c.job(), c.phase(), c.rank_worker(), state_.pool);
      if (rank0.ok()) targets.push_back({id, *rank0});
    }
  }
  std::map<std::string, int64_t> wanted;  // job -> checkpoint step
  for (const auto& target : targets) {
    const std::string& id = target.first;
    absl::StatusOr<int64_t> scheduled =
        CommandRelay::Send(*target.second, id, v1::STEP_COMMAND_CHECKPOINT);
    if (!scheduled.ok()) continue;
    wanted[id] = *scheduled;
    StateLock lock(&state_);
    state_.jobs.Event(id, absl::StrCat("the coordinator is stopping: checkpoint scheduled "
                                       "before step ",
                                       *scheduled,
                                       "; the job resumes from it "
                                       "when the coordinator starts again"));
  }
  int done = 0;
  {
    absl::MutexLock lock(&state_.mu);
    while (true) {
      done = 0;
      for (const auto& [id, step] : wanted) {
        const v1::Job& job = state_.jobs.at(id).controller.job();
        if (job.checkpoint_step() >= step || job.state() != v1::JOB_STATE_RUNNING) ++done;
      }
      if (done == static_cast<int>(wanted.size()) || absl::Now() >= deadline) break;
      state_.changed.WaitWithTimeout(&state_.mu, absl::Milliseconds(50));
    }
  }
  (void)state_.FlushWrites();  // the records naming the checkpoints are durable before the exit
  return done;
}

}  // namespace pipetrain::coordinator
