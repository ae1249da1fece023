#include "client/job_views.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/states.h"
#include "runtime/base/byte_size.h"
#include "runtime/base/exit_codes.h"
#include "runtime/base/printable.h"

namespace pipetrain::client {

void PrintJobTable(const v1::Job& job) {
  std::printf("job %s%s%s: %s", Printable(job.id()).c_str(), job.spec().name().empty() ? "" : " ",
              Printable(job.spec().name()).c_str(), StateName(job.state()).c_str());
  if (!job.message().empty()) std::printf(" (%s)", Printable(job.message()).c_str());
  std::printf("\nstep %lld/%d  loss %.4f  lr %.4g%s  %.0f %s/s  %d stages x %d replicas\n",
              static_cast<long long>(job.step() + 1), job.steps(), job.loss(), job.learning_rate(),
              GradNormText(job).c_str(), job.tokens_per_s(), job.data_unit().c_str(), job.stages(),
              job.replicas());
  if (job.eval_step() > 0) std::printf("%s\n", EvalText(job).c_str());
  if (job.checkpoint_step() > 0 || job.restarts() > 0 || job.skipped_steps() > 0) {
    std::printf(
        "generation %d  restarts %d/%d  checkpoint before step %lld%s%s  skipped steps %lld\n",
        job.generation(), job.restarts(), job.spec().max_restarts(),
        static_cast<long long>(job.checkpoint_step()), job.checkpoint_path().empty() ? "" : " in ",
        Printable(job.checkpoint_path()).c_str(), static_cast<long long>(job.skipped_steps()));
  }
  if (!job.resumed_from().empty()) {
    std::printf("resumed from %s\n", Printable(job.resumed_from()).c_str());
    for (const std::string& why : job.checkpoints_passed_over()) {
      std::printf("  passed over %s\n", Printable(why).c_str());
    }
  }
  // `stages: auto`: the plan, and its predictions against what the ranks report.
  if (job.has_plan()) {
    const v1::PlannedLayout& p = job.plan();
    std::printf("planned by %s for %d workers: %s\n", Printable(p.planner()).c_str(), p.workers(),
                Printable(p.layout()).c_str());
    double measured = 0;  // the slowest rank's last step
    for (const v1::StageStatus& s : job.stage_status()) {
      measured = std::max(measured, s.breakdown().last_step_s());
    }
    std::printf("  step: predicted %.2f ms", p.predicted_step_time_s() * 1e3);
    if (measured > 0) std::printf(", measured %.2f ms (last step)", measured * 1e3);
    std::printf("\n  peak tensor memory per stage, predicted (measured on replica 0):");
    for (int s = 0; s < p.predicted_peak_memory_bytes_size(); ++s) {
      int64_t measured_bytes = 0;
      for (const v1::StageStatus& st : job.stage_status()) {
        if (st.stage() == s && st.replica() == 0) measured_bytes = st.peak_tensor_bytes();
      }
      std::printf(" %s", MebiBytes(p.predicted_peak_memory_bytes(s)).c_str());
      if (measured_bytes > 0) std::printf(" (%s)", MebiBytes(measured_bytes).c_str());
    }
    std::printf("\n");
  }
  // Each restart: what ended the generation before it, where it went on, how fast.
  for (const v1::Recovery& r : job.recoveries()) {
    std::printf(
        "restart to generation %d: %s\n  after step %lld, from step %lld (%s) on %d "
        "stages x %d replicas x %d micro-batches",
        r.generation(), Printable(r.cause()).c_str(),
        static_cast<long long>(r.failed_after_step() + 1),
        static_cast<long long>(r.resumed_at_step()),
        r.from_survivors()        ? "the survivors' state: no step run again"
        : r.resumed_at_step() > 0 ? "its checkpoint"
                                  : "the start",
        r.stages(), r.replicas(), r.microbatches());
    if (r.first_step_unix_ms() > 0) {
      std::printf("; first good step %.2f s after the fault was seen",
                  (r.first_step_unix_ms() - r.detected_unix_ms()) / 1e3);
    }
    std::printf("\n");
  }
  if (job.stage_status_size() == 0) return;
  std::printf("%-6s %-8s %-10s %-6s %-12s %-14s %-10s %-10s %-10s %-10s\n", "stage", "replica",
              "worker", "step", "state", "action", "compute_s", "wait_s", "params", "peak_mem");
  for (const v1::StageStatus& s : job.stage_status()) {
    std::string action = Printable(s.action());
    if (!s.waiting_for().empty()) action += " <- " + Printable(s.waiting_for());
    std::printf("%-6d %-8d %-10s %-6lld %-12s %-14s %-10.3f %-10.3f %-10s %-10s\n", s.stage(),
                s.replica(), Printable(s.worker_id()).c_str(), static_cast<long long>(s.step() + 1),
                StateName(s.state()).c_str(), action.empty() ? "-" : action.c_str(), s.compute_s(),
                s.wait_s(), MebiBytes(s.parameter_bytes()).c_str(),
                MebiBytes(s.peak_memory_bytes()).c_str());
  }
  if (job.state() != v1::JOB_STATE_RUNNING) return;
  // Stage x replica grid of what each rank does, and whom it waits for: in a stuck job the
  // arrows show the chain (or cycle) of waits.
  int waiting = 0;
  for (const v1::StageStatus& s : job.stage_status()) waiting += !s.waiting_for().empty();
  if (waiting == 0) return;
  std::printf("\nwho waits for whom (as of the last heartbeats):\n%-8s", "");
  for (int r = 0; r < job.replicas(); ++r)
    std::printf("  %-24s", absl::StrCat("replica ", r).c_str());
  std::printf("\n");
  for (int st = 0; st < job.stages(); ++st) {
    std::printf("%-8s", absl::StrCat("stage ", st).c_str());
    for (int r = 0; r < job.replicas(); ++r) {
      const int rank = r * job.stages() + st;
      std::string cell = "-";
      if (rank < job.stage_status_size()) {
        const v1::StageStatus& s = job.stage_status(rank);
        if (!s.action().empty()) cell = Printable(s.action());
        if (!s.waiting_for().empty()) cell += " -> " + Printable(s.waiting_for());
      }
      std::printf("  %-24s", cell.c_str());
    }
    std::printf("\n");
  }
  if (waiting == job.stage_status_size()) {
    std::printf(
        "every rank is waiting: if this stays so, the job is stuck where the arrows "
        "meet (each wait ends with an error naming it after timeout_s)\n");
  }
}

// Where `job` is, for the progress line; its elapsed time from the coordinator's clock (to
// now while it runs, so as this machine's clock agrees).
progress::Progress ProgressOf(const v1::Job& job) {
  progress::Progress p;
  p.state = StateName(job.state());
  p.done = job.step() + 1;
  p.steps = job.steps();
  p.loss = job.loss();
  p.rate = job.tokens_per_s();
  p.unit = job.data_unit();
  if (job.started_unix_ms() > 0) {
    const int64_t end =
        job.finished_unix_ms() > 0 ? job.finished_unix_ms() : absl::ToUnixMillis(absl::Now());
    p.elapsed_s = static_cast<double>(end - job.started_unix_ms()) / 1e3;
  }
  return p;
}

// Follows a job until it ends: the progress line (runtime/base/progress_line.h) on stderr.
int FollowJobStream(JobClient& client, const std::string& id, bool json, bool quiet) {
  grpc::ClientContext ctx;
  v1::GetJobRequest request;
  request.set_id(id);
  auto reader = client.stub()->WatchJob(&ctx, request);
  v1::Job job;
  progress::ProgressLine line(isatty(STDERR_FILENO));
  bool have = false;
  while (reader->Read(&job)) {
    have = true;
    if (json) {
      std::printf("%s\n", Json(job).c_str());
      std::fflush(stdout);
    } else if (!quiet) {
      std::fputs(line.Update(ProgressOf(job)).c_str(), stderr);
    }
    if (JobEnded(job.state())) break;
  }
  std::fputs(line.Finish().c_str(), stderr);
  grpc::Status s = reader->Finish();
  if (!have) return client.Fail(s, absl::StrCat("following ", id));
  if (!JobEnded(job.state())) {
    return client.Fail(
        s.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "the stream ended early") : s,
        absl::StrCat("following ", id));
  }
  if (!json && !quiet) {
    std::printf("job %s %s%s%s\n", Printable(id).c_str(), StateName(job.state()).c_str(),
                job.message().empty() ? "" : ": ", Printable(job.message()).c_str());
  }
  return job.state() == v1::JOB_STATE_SUCCEEDED ? exit_code::kOk : exit_code::kJobFailed;
}

}  // namespace pipetrain::client
