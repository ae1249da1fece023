#include "client/cluster_calls.h"

#include <cstdio>

#include "absl/time/clock.h"
#include "client/job_client.h"
#include "client/job_views.h"
#include "rpc/status.h"
#include "runtime/base/exit_codes.h"

namespace pipetrain::client {

int SubmitJob(const std::string& address, const v1::JobSpec& spec, v1::Job* job,
              const std::string& model_profile_json) {
  JobClient client(LocalClusterOptions(address));
  v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  request.set_model_profile_json(model_profile_json);
  grpc::Status s = client.Call(&v1::JobService::Stub::SubmitJob, request, job);
  return s.ok() ? 0 : client.Fail(s, "submit");
}

int WaitForWorkers(const std::string& address, int workers, absl::Duration timeout) {
  JobClient client(LocalClusterOptions(address));
  const absl::Time deadline = absl::Now() + timeout;
  int registered = 0;
  while (true) {
    v1::ListWorkersRequest request;
    v1::ListWorkersResponse response;
    grpc::Status s = client.Call(&v1::JobService::Stub::ListWorkers, request, &response);
    if (!s.ok()) return client.Fail(s, "listing the workers");
    registered = 0;
    for (const v1::WorkerInfo& w : response.workers())
      registered += w.state() != v1::WORKER_STATE_LOST;
    if (registered >= workers) return 0;
    if (absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  std::fprintf(stderr, "pipetrain: only %d of %d workers registered within %s\n", registered,
               workers, absl::FormatDuration(timeout).c_str());
  return exit_code::kUnavailable;
}

int FollowJob(const std::string& address, const std::string& id, bool quiet, v1::Job* job) {
  JobClient client(LocalClusterOptions(address));
  const int code = FollowJobStream(client, id, /*json=*/false, quiet);
  v1::GetJobRequest request;
  request.set_id(id);
  if (code != exit_code::kUnavailable &&
      client.Call(&v1::JobService::Stub::GetJob, request, job).ok() && !quiet) {
    std::printf("\n");
    PrintJobTable(*job);
  }
  return code;
}

absl::StatusOr<std::vector<v1::CommittedStep>> CommittedSteps(const std::string& address,
                                                              const std::string& id) {
  JobClient client(LocalClusterOptions(address));
  std::vector<v1::CommittedStep> steps;
  v1::ListStepsRequest request;
  request.set_job_id(id);
  request.set_after_step(-1);
  while (true) {
    v1::ListStepsResponse page;
    grpc::Status s = client.Call(&v1::JobService::Stub::ListSteps, request, &page);
    if (!s.ok()) return rpc::ToAbslStatus(s);
    if (page.steps_size() == 0) return steps;
    for (v1::CommittedStep& step : *page.mutable_steps()) steps.push_back(std::move(step));
    request.set_after_step(steps.back().step());
  }
}

}  // namespace pipetrain::client
