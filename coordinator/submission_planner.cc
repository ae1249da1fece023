#include "coordinator/submission_planner.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "coordinator/job_traffic.h"
#include "jobspec/planned_layout.h"
#include "runtime/base/host_port.h"
#include "runtime/model/model_config.h"
#include "runtime/planner/profile_json.h"

namespace pipetrain::coordinator {

absl::StatusOr<planner::PlanResult> SubmissionPlanner::RunGated(
    const planner::ModelProfile& profile, const planner::ClusterProfile& cluster,
    planner::PlanRequest request) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (busy_ && waiting_ >= kMaxWaitingPlans) {
      return absl::ResourceExhaustedError(
          absl::StrCat("stages: auto: the coordinator is planning other jobs (one at a time, ",
                       waiting_, " waiting); submit again shortly"));
    }
    ++waiting_;
    const bool turn =
        done_.wait_for(lock, absl::ToChronoSeconds(options_.wait), [this] { return !busy_; });
    --waiting_;
    if (!turn) {
      return absl::ResourceExhaustedError(
          absl::StrCat("stages: auto: no turn to plan within ", absl::FormatDuration(options_.wait),
                       " (other jobs were being planned); submit again shortly"));
    }
    busy_ = true;
  }
  request.cpu_budget = options_.cpu_budget;
  request.deadline = absl::Now() + options_.time_limit;
  absl::StatusOr<planner::PlanResult> plan = absl::InternalError("not planned");
  // A thread of its own at the lowest priority (nice applies to one thread on Linux): running
  // jobs' workers and this coordinator's state loop and health come first.
  std::thread planning([&] {
    (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19);
    plan = planner::MakePlan(profile, cluster, request);
  });
  planning.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = false;
  }
  done_.notify_one();
  if (!plan.ok() && absl::IsDeadlineExceeded(plan.status())) {
    return absl::DeadlineExceededError(absl::StrCat("stages: auto: ", plan.status().message()));
  }
  return plan;
}

absl::StatusOr<SubmissionPlanner::Planned> SubmissionPlanner::Plan(
    const job::JobSpec& config, const std::string& profile_json,
    const std::vector<v1::WorkerInfo>& workers) {
  if (profile_json.empty()) {
    return absl::InvalidArgumentError(
        "stages: auto needs the model's profile (pipetrain submit measures it; pipetrain "
        "profile prints it)");
  }
  if (profile_json.size() > kMaxProfileBytes) {
    return absl::InvalidArgumentError(absl::StrCat("model_profile_json: ", profile_json.size(),
                                                   " bytes, at most ", kMaxProfileBytes));
  }
  absl::StatusOr<planner::ModelProfile> profile = planner::ModelProfileFromJson(profile_json);
  if (!profile.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model_profile_json: ", profile.status().message()));
  }
  const size_t layers = profile->sizes.front().layers.size();
  if (layers > kMaxPlannedLayers || profile->sizes.size() > kMaxProfiledSizes) {
    return absl::InvalidArgumentError(
        absl::StrCat("model_profile_json: ", layers, " layers at ", profile->sizes.size(),
                     " micro-batch sizes; the coordinator plans at most ", kMaxPlannedLayers,
                     " layers at ", kMaxProfiledSizes, " sizes"));
  }
  if (absl::StatusOr<std::vector<std::string>> names =
          model::BuiltinLayerNames(job::ModelConfigOf(config));
      names.ok() && names->size() != layers) {
    return absl::InvalidArgumentError(absl::StrCat("model_profile_json: profiles ", layers,
                                                   " layers; the job's model has ", names->size()));
  }
  planner::ClusterProfile cluster;
  cluster.workers = 0;
  std::map<std::string, int> on_host;  // workers per host (its name, else its address)
  int cores = 0;
  for (const v1::WorkerInfo& w : workers) {
    if (w.state() == v1::WORKER_STATE_LOST || w.state() == v1::WORKER_STATE_DRAINING) continue;
    ++cluster.workers;
    if (w.memory_bytes() > 0 &&
        (cluster.memory_bytes == 0 || w.memory_bytes() < cluster.memory_bytes)) {
      cluster.memory_bytes = w.memory_bytes();
    }
    ++on_host[w.host().empty() ? HostOf(w.address()) : w.host()];
    cores = std::max(cores, w.cores());
  }
  // Workers on one host share its cores (one intra-op thread each, as profiled).
  if (on_host.size() == 1 && cluster.workers > 1) cluster.shared_cores = cores;
  if (cluster.workers == 0) {
    return absl::FailedPreconditionError(
        "stages: auto: no workers to plan for (start the workers, then submit)");
  }
  cluster.link = profile->p2p;
  cluster.allreduce = profile->allreduce;
  // On several hosts the plan places its ranks on them (within the planned workers' bound).
  if (on_host.size() > 1 && cluster.workers <= kMaxPlannedWorkers) {
    for (const auto& [host, count] : on_host) cluster.host_workers.push_back(count);
    const planner::HostLinks& links =
        profile->between_hosts.measured() ? profile->between_hosts : options_.host_links;
    cluster.between_hosts = links.measured() ? links.p2p : kBetweenHostsLink;
    cluster.between_hosts_allreduce = links.measured() ? links.allreduce : kBetweenHostsLink;
  }
  cluster.workers = std::min(cluster.workers, kMaxPlannedWorkers);
  planner::PlanRequest request = jobspec::PlanRequestFor(config);
  request.max_micro_batches = 64;
  for (const planner::MicroBatchProfile& size : profile->sizes) {
    request.micro_batch_sizes.push_back(size.micro_batch_size);  // only what was measured
  }
  absl::StatusOr<planner::PlanResult> plan = RunGated(*profile, cluster, request);
  if (!plan.ok()) return plan.status();
  jobspec::RunMarkedSchedule(*profile, cluster, config, &*plan);
  Planned planned;
  planned.spec = jobspec::WithLayout(config, plan->chosen.layout);
  planned.record = jobspec::PlannedLayoutRecord(*plan, cluster);
  return planned;
}

}  // namespace pipetrain::coordinator
