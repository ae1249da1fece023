#include "client/jobs.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include <google/protobuf/util/json_util.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/local_cluster.h"
#include "client/stage_breakdown.h"
#include "jobspec/job_config_from_spec.h"
#include "jobspec/spec_flags.h"
#include "pipetrain/v1/job_service.grpc.pb.h"
#include "proto/states.h"
#include "rpc/health.h"
#include "rpc/security.h"
#include "rpc/status.h"
#include "runtime/base/byte_size.h"
#include "runtime/base/exit_codes.h"
#include "runtime/base/printable.h"
#include "runtime/base/progress_line.h"

namespace pipetrain::client {
namespace {

struct Common {
  std::string coordinator;
  std::string output = "table";
  double timeout_s = 10;
  std::string token_file;
  rpc::SecurityOptions security;           // the token loaded before the command runs
  std::shared_ptr<grpc::Channel> channel;  // made then too, with the token and TLS
};

// The exit code of a failed call: the one table (runtime/base/exit_codes.h).
int ExitFor(const grpc::Status& s) { return exit_code::For(rpc::ToAbslStatus(s)); }

int Fail(const grpc::Status& s, const std::string& what) {
  std::fprintf(stderr, "pipetrain: %s: %s\n", Printable(what).c_str(),
               Printable(s.error_message()).c_str());
  return ExitFor(s);
}

std::string Json(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out;
}


class Client {
 public:
  explicit Client(const Common& c) : common_(c), channel_(c.channel) {
    stub_ = v1::JobService::NewStub(channel_);
  }
  // Prints why a call failed, on one line, and returns the exit code.
  int Fail(const grpc::Status& s, const std::string& what) const {
    if (ExitFor(s) != exit_code::kDenied) return client::Fail(s, what);
    std::fprintf(stderr,
                 "pipetrain: %s: the coordinator at %s refused the call: %s (give %s)\n",
                 Printable(what).c_str(), common_.coordinator.c_str(),
                 Printable(s.error_message()).c_str(),
                 common_.security.token.empty()
                     ? "--token-file or PIPETRAIN_TOKEN"
                     : "the coordinator's token with --token-file or PIPETRAIN_TOKEN");
    return exit_code::kDenied;
  }
  void Prepare(grpc::ClientContext* ctx, bool streaming = false) const {
    if (!streaming) {
      ctx->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(common_.timeout_s * 1000)));
    }
  }
  // One unary call with the --timeout deadline.
  template <typename Request, typename Response>
  grpc::Status Call(grpc::Status (v1::JobService::Stub::*method)(grpc::ClientContext*,
                                                                const Request&, Response*),
                    const Request& request, Response* response) {
    grpc::ClientContext ctx;
    Prepare(&ctx);
    return (stub_.get()->*method)(&ctx, request, response);
  }
  v1::JobService::Stub* stub() { return stub_.get(); }
  std::shared_ptr<grpc::Channel> channel() { return channel_; }

 private:
  Common common_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> stub_;
};


void PrintJobTable(const v1::Job& job) {
  std::printf("job %s%s%s: %s", Printable(job.id()).c_str(),
              job.spec().name().empty() ? "" : " ", Printable(job.spec().name()).c_str(),
              StateName(job.state()).c_str());
  if (!job.message().empty()) std::printf(" (%s)", Printable(job.message()).c_str());
  std::printf("\nstep %lld/%d  loss %.4f  %.0f %s/s  %d stages x %d replicas\n",
              static_cast<long long>(job.step() + 1), job.steps(), job.loss(),
              job.tokens_per_s(), job.data_unit().c_str(), job.stages(), job.replicas());
  if (job.checkpoint_step() > 0 || job.restarts() > 0 || job.skipped_steps() > 0) {
    std::printf("generation %d  restarts %d/%d  checkpoint before step %lld%s%s  skipped steps %lld\n",
                job.generation(), job.restarts(), job.spec().max_restarts(),
                static_cast<long long>(job.checkpoint_step()),
                job.checkpoint_path().empty() ? "" : " in ",
                Printable(job.checkpoint_path()).c_str(),
                static_cast<long long>(job.skipped_steps()));
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
    std::printf("planned by %s for %d workers: %s\n", Printable(p.planner()).c_str(),
                p.workers(), Printable(p.layout()).c_str());
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
    std::printf("restart to generation %d: %s\n  after step %lld, from step %lld on %d stages x "
                "%d replicas x %d micro-batches",
                r.generation(), Printable(r.cause()).c_str(),
                static_cast<long long>(r.failed_after_step() + 1),
                static_cast<long long>(r.resumed_at_step()), r.stages(), r.replicas(),
                r.microbatches());
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
  for (int r = 0; r < job.replicas(); ++r) std::printf("  %-24s", absl::StrCat("replica ", r).c_str());
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
    std::printf("every rank is waiting: if this stays so, the job is stuck where the arrows "
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
    const int64_t end = job.finished_unix_ms() > 0 ? job.finished_unix_ms()
                                                   : absl::ToUnixMillis(absl::Now());
    p.elapsed_s = static_cast<double>(end - job.started_unix_ms()) / 1e3;
  }
  return p;
}

// Follows a job until it ends: the progress line (runtime/base/progress_line.h) on stderr.
int Follow(Client& client, const std::string& id, bool json, bool quiet = false) {
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

// The options of `pipetrain run`'s own calls to its local cluster: plaintext loopback,
// sending $PIPETRAIN_TOKEN if it is set (the daemons it starts inherit it, and then ask for it).
Common LocalClusterCommon(const std::string& address) {
  Common common;
  common.coordinator = address;
  common.security.token = rpc::LoadToken("").value_or("");
  auto channel = rpc::MakeChannel(address, common.security);
  common.channel =
      channel.ok() ? *channel : grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  return common;
}

}  // namespace

int SubmitJob(const std::string& address, const v1::JobSpec& spec, v1::Job* job,
              const std::string& model_profile_json) {
  Client client(LocalClusterCommon(address));
  v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  request.set_model_profile_json(model_profile_json);
  grpc::Status s = client.Call(&v1::JobService::Stub::SubmitJob, request, job);
  return s.ok() ? 0 : client.Fail(s, "submit");
}

int WaitForWorkers(const std::string& address, int workers, absl::Duration timeout) {
  Client client(LocalClusterCommon(address));
  const absl::Time deadline = absl::Now() + timeout;
  int registered = 0;
  while (true) {
    v1::ListWorkersRequest request;
    v1::ListWorkersResponse response;
    grpc::Status s = client.Call(&v1::JobService::Stub::ListWorkers, request, &response);
    if (!s.ok()) return client.Fail(s, "listing the workers");
    registered = 0;
    for (const v1::WorkerInfo& w : response.workers()) registered += w.state() != v1::WORKER_STATE_LOST;
    if (registered >= workers) return 0;
    if (absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  std::fprintf(stderr, "pipetrain: only %d of %d workers registered within %s\n", registered,
               workers, absl::FormatDuration(timeout).c_str());
  return exit_code::kUnavailable;
}

int FollowJob(const std::string& address, const std::string& id, bool quiet, v1::Job* job) {
  Client client(LocalClusterCommon(address));
  const int code = Follow(client, id, /*json=*/false, quiet);
  v1::GetJobRequest request;
  request.set_id(id);
  if (code != exit_code::kUnavailable &&
      client.Call(&v1::JobService::Stub::GetJob, request, job).ok() && !quiet) {
    std::printf("\n");
    PrintJobTable(*job);
  }
  return code;
}


namespace {

// What the job commands share: the options every one takes, and the one chosen on the
// command line (set by its callback, run once the token and TLS files are read).
struct JobCommands {
  std::shared_ptr<Common> common;
  std::shared_ptr<std::function<int()>> chosen;

  // Adds the options every command takes to `cmd`.
  void AddCommonOptions(CLI::App* cmd) const {
    cmd->add_option("--coordinator", common->coordinator,
                    "host:port of the coordinator ($PIPETRAIN_COORDINATOR)")
        ->capture_default_str();
    cmd->add_option("-o,--output", common->output, "table or json")
        ->check(CLI::IsMember({"table", "json"}))
        ->capture_default_str();
    cmd->add_option("--timeout", common->timeout_s, "seconds each call may take")
        ->capture_default_str();
    cmd->add_option("--token-file", common->token_file,
                    "file holding the coordinator's token ($PIPETRAIN_TOKEN)");
    cmd->add_option("--tls-ca", common->security.tls_ca,
                    "PEM CA to verify the coordinator with (speaks TLS)");
    cmd->add_option("--tls-cert", common->security.tls_cert,
                    "PEM client certificate, for a coordinator that asks one (mutual TLS)");
    cmd->add_option("--tls-key", common->security.tls_key, "PEM private key of --tls-cert");
  }
};

// `submit`: a job file to the coordinator; prints its id (and follows it with -f).
void AddSubmit(CLI::App& app, const JobCommands& c) {
  const std::shared_ptr<Common>& common = c.common;
  const std::shared_ptr<std::function<int()>>& chosen = c.chosen;
  auto submit = app.add_subcommand(
      "submit", "Submit a job to the coordinator (a YAML job file, the flags below over it; "
                "the same job `pipetrain run` takes); prints its id");
  auto job_file = std::make_shared<std::string>();
  auto follow = std::make_shared<bool>(false);
  submit->add_option("job", *job_file, "YAML job file (see examples/)");
  submit->add_flag("-f,--follow", *follow, "follow the job until it ends; exit 1 if it fails");
  c.AddCommonOptions(submit);
  auto spec_flags = std::make_shared<jobspec::SpecFlags>(submit);
  submit->callback([=] {
    *chosen = [=]() -> int {
      auto spec = jobspec::BuildJobSpec(*job_file, *spec_flags);
      if (!spec.ok()) {
        std::fprintf(stderr, "pipetrain: %s\n", std::string(spec.status().message()).c_str());
        return exit_code::For(spec.status());
      }
      // Checked here too, as the coordinator will: an invalid spec exits 2 naming every
      // violation, even one too large to send (a 10 MB name).
      const std::string what = job_file->empty() ? std::string("submitting the job")
                                                 : absl::StrCat("submitting ", *job_file);
      if (absl::Status valid = jobspec::JobConfigFromSpec(*spec).status(); !valid.ok()) {
        std::fprintf(stderr, "pipetrain: %s: %s\n", what.c_str(),
                     std::string(valid.message()).c_str());
        return exit_code::For(valid);
      }
      Client client(*common);
      v1::SubmitJobRequest request;
      *request.mutable_spec() = *spec;
      if (spec->auto_stages()) {  // the coordinator plans it with the model's profile
        absl::StatusOr<std::string> profile = MeasureModelProfile(*spec, common->output == "json");
        if (!profile.ok()) {
          std::fprintf(stderr, "pipetrain: %s\n", std::string(profile.status().message()).c_str());
          return exit_code::For(profile.status());
        }
        request.set_model_profile_json(*profile);
      }
      v1::Job job;
      grpc::Status s = client.Call(&v1::JobService::Stub::SubmitJob, request, &job);
      if (!s.ok()) return client.Fail(s, what);
      if (common->output == "json" && !*follow) {
        std::printf("%s\n", Json(job).c_str());
      } else {
        std::printf("%s\n", job.id().c_str());
        std::fflush(stdout);
      }
      return *follow ? Follow(client, job.id(), common->output == "json") : 0;
    };
  });
}

// `status`: a job's state and per-stage table.
void AddStatus(CLI::App& app, const JobCommands& c) {
  const std::shared_ptr<Common>& common = c.common;
  const std::shared_ptr<std::function<int()>>& chosen = c.chosen;
  auto status = app.add_subcommand("status", "A job's state and per-stage table");
  auto status_id = std::make_shared<std::string>();
  status->add_option("job", *status_id, "job id")->required();
  c.AddCommonOptions(status);
  status->callback([=] {
    *chosen = [=]() -> int {
      Client client(*common);
      v1::GetJobRequest request;
      request.set_id(*status_id);
      v1::Job job;
      grpc::Status s = client.Call(&v1::JobService::Stub::GetJob, request, &job);
      if (!s.ok()) return client.Fail(s, "status");
      if (common->output == "json") {
        std::printf("%s\n", Json(job).c_str());
      } else {
        PrintJobTable(job);
      }
      return exit_code::kOk;
    };
  });
}

// `metrics`: where each rank of a job spends a step (client/stage_breakdown.h).
void AddMetrics(CLI::App& app, const JobCommands& c) {
  const std::shared_ptr<Common>& common = c.common;
  const std::shared_ptr<std::function<int()>>& chosen = c.chosen;
  auto metrics = app.add_subcommand(
      "metrics",
      "Where each stage of a job spends a step: compute, receive and send time, exposed "
      "AllReduce, bubble and straggler ratios, peak memory (from the coordinator; no "
      "Prometheus needed)");
  auto id = std::make_shared<std::string>();
  auto watch_s = std::make_shared<double>(0);
  metrics->add_option("job", *id, "job id")->required();
  metrics->add_option("-w,--watch", *watch_s,
                      "print again every this many seconds while the job runs (0: once)")
      ->check(CLI::Range(0.0, 3600.0));
  c.AddCommonOptions(metrics);
  metrics->callback([=] {
    *chosen = [=]() -> int {
      Client client(*common);
      v1::GetJobRequest request;
      request.set_id(*id);
      while (true) {
        v1::Job job;
        grpc::Status s = client.Call(&v1::JobService::Stub::GetJob, request, &job);
        if (!s.ok()) return client.Fail(s, "metrics");
        if (common->output == "json") {
          std::printf("%s\n", StageBreakdownJson(job).dump().c_str());
        } else {
          std::printf("%s", StageBreakdownTable(job).c_str());
        }
        std::fflush(stdout);
        if (*watch_s <= 0 || job.state() != v1::JOB_STATE_RUNNING) return exit_code::kOk;
        std::this_thread::sleep_for(std::chrono::duration<double>(*watch_s));
        if (common->output != "json") std::printf("\n");
      }
    };
  });
}

// `list`: every job, oldest first.
void AddList(CLI::App& app, const JobCommands& c) {
  const std::shared_ptr<Common>& common = c.common;
  const std::shared_ptr<std::function<int()>>& chosen = c.chosen;
  auto list = app.add_subcommand("list", "Every job, oldest first");
  c.AddCommonOptions(list);
  list->callback([=] {
    *chosen = [=]() -> int {
      Client client(*common);
      v1::ListJobsRequest request;  // page after page: no answer nears the message limit
      do {
        v1::ListJobsResponse response;
        grpc::Status s = client.Call(&v1::JobService::Stub::ListJobs, request, &response);
        if (!s.ok()) return client.Fail(s, "list");
        if (common->output == "table" && request.page_token().empty()) {  // after the first
          std::printf("%-10s %-10s %-11s %-12s %-10s %s\n", "id", "state", "step", "loss",
                      "layout", "name");
        }
        for (const v1::Job& job : response.jobs()) {
          if (common->output == "json") {
            std::printf("%s\n", Json(job).c_str());
          } else {
            std::printf("%-10s %-10s %-11s %-12.4f %-10s %s\n", Printable(job.id()).c_str(),
                        StateName(job.state()).c_str(),
                        absl::StrCat(job.step() + 1, "/", job.steps()).c_str(), job.loss(),
                        absl::StrCat(job.stages(), "x", job.replicas()).c_str(),
                        Printable(job.spec().name()).c_str());
          }
        }
        request.set_page_token(response.next_page_token());
      } while (!request.page_token().empty());
      return exit_code::kOk;
    };
  });
}

// `cancel`: a queued or running job.
void AddCancel(CLI::App& app, const JobCommands& c) {
  const std::shared_ptr<Common>& common = c.common;
  const std::shared_ptr<std::function<int()>>& chosen = c.chosen;
  auto cancel = app.add_subcommand("cancel", "Cancel a queued or running job");
  auto cancel_id = std::make_shared<std::string>();
  cancel->add_option("job", *cancel_id, "job id")->required();
  c.AddCommonOptions(cancel);
  cancel->callback([=] {
    *chosen = [=]() -> int {
      Client client(*common);
      v1::CancelJobRequest request;
      request.set_id(*cancel_id);
      v1::Job job;
      grpc::Status s = client.Call(&v1::JobService::Stub::CancelJob, request, &job);
      if (!s.ok()) return client.Fail(s, "cancel");
      std::printf("%s\n", common->output == "json" ? Json(job).c_str()
                                                    : absl::StrCat(job.id(), " cancelled").c_str());
      return exit_code::kOk;
    };
  });
}

// `flush`, `switch`, `checkpoint`, `stop`: step commands at a named step boundary.
void AddStepCommands(CLI::App& app, const JobCommands& c) {
  const std::shared_ptr<Common>& common = c.common;
  const std::shared_ptr<std::function<int()>>& chosen = c.chosen;
  struct StepCommandVerb {
    const char* name;
    v1::StepCommand command;
    const char* help;
  };
  static const StepCommandVerb kVerbs[] = {
      {"flush", v1::STEP_COMMAND_FLUSH,
       "Drain a running job's pipeline before a step (weights unchanged)"},
      {"switch", v1::STEP_COMMAND_SWITCH_VERSION,
       "Drain before a step and run it on the newest weights (2BW: restarts the 1-step delay)"},
      {"checkpoint", v1::STEP_COMMAND_CHECKPOINT,
       "Switch before a step and write a checkpoint of every layer (weights and optimizer "
       "state) to <checkpoint.dir>/step-N/ (the job's checkpoint.dir; by default "
       "checkpoints/JOB-ID)"},
      {"stop", v1::STEP_COMMAND_STOP,
       "End a running job cleanly before a step (it succeeds with the steps done)"},
  };
  for (const StepCommandVerb& verb : kVerbs) {
    auto cmd = app.add_subcommand(verb.name, verb.help);
    auto id = std::make_shared<std::string>();
    auto step = std::make_shared<int64_t>(0);
    cmd->add_option("job", *id, "job id")->required();
    cmd->add_option("--at-step", *step,
                    "the step it takes effect before (default: the earliest possible, about "
                    "two steps ahead; stage 0 fixes each boundary two steps early)")
        ->check(CLI::PositiveNumber);
    c.AddCommonOptions(cmd);
    const v1::StepCommand command = verb.command;
    const std::string name = verb.name;
    cmd->callback([=] {
      *chosen = [=]() -> int {
        Client client(*common);
        v1::SendCommandRequest request;
        request.set_job_id(*id);
        request.set_command(command);
        request.set_step(*step);
        v1::SendCommandResponse response;
        grpc::Status s = client.Call(&v1::JobService::Stub::SendCommand, request, &response);
        if (!s.ok()) return client.Fail(s, name);
        if (common->output == "json") {
          std::printf("{\"job_id\":\"%s\",\"command\":\"%s\",\"step\":%lld}\n", id->c_str(),
                      name.c_str(), static_cast<long long>(response.step()));
        } else {
          std::printf("%s scheduled before step %lld of %s\n", name.c_str(),
                      static_cast<long long>(response.step()), id->c_str());
        }
        return exit_code::kOk;
      };
    });
  }
}

// `logs`: a job's events (and the ones to come with -f).
void AddLogs(CLI::App& app, const JobCommands& c) {
  const std::shared_ptr<Common>& common = c.common;
  const std::shared_ptr<std::function<int()>>& chosen = c.chosen;
  auto logs = app.add_subcommand("logs", "A job's events");
  auto logs_id = std::make_shared<std::string>();
  auto logs_follow = std::make_shared<bool>(false);
  logs->add_option("job", *logs_id, "job id")->required();
  logs->add_flag("-f,--follow", *logs_follow, "keep printing until the job ends");
  c.AddCommonOptions(logs);
  logs->callback([=] {
    *chosen = [=]() -> int {
      Client client(*common);
      grpc::ClientContext ctx;
      if (!*logs_follow) client.Prepare(&ctx);
      v1::StreamEventsRequest request;
      request.set_job_id(*logs_id);
      request.set_follow(*logs_follow);
      auto reader = client.stub()->StreamEvents(&ctx, request);
      v1::JobEvent e;
      while (reader->Read(&e)) {
        if (common->output == "json") {
          std::printf("%s\n", Json(e).c_str());
        } else {
          std::printf("%s  %s\n",
                      absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMillis(e.unix_ms()),
                                       absl::LocalTimeZone())
                          .c_str(),
                      Printable(e.text()).c_str());
        }
        std::fflush(stdout);
      }
      grpc::Status s = reader->Finish();
      return s.ok() ? 0 : client.Fail(s, "logs");
    };
  });
}

// `workers`: the worker pool.
void AddWorkers(CLI::App& app, const JobCommands& c) {
  const std::shared_ptr<Common>& common = c.common;
  const std::shared_ptr<std::function<int()>>& chosen = c.chosen;
  auto workers = app.add_subcommand("workers", "The worker pool");
  c.AddCommonOptions(workers);
  workers->callback([=] {
    *chosen = [=]() -> int {
      Client client(*common);
      v1::ListWorkersResponse response;
      grpc::Status s =
          client.Call(&v1::JobService::Stub::ListWorkers, v1::ListWorkersRequest(), &response);
      if (!s.ok()) return client.Fail(s, "workers");
      if (common->output == "table") {
        std::printf("%-10s %-22s %-6s %-5s %-8s %-6s %-10s %s\n", "id", "address", "device",
                    "cores", "memory", "state", "job", "rank");
      }
      for (const v1::WorkerInfo& w : response.workers()) {
        if (common->output == "json") {
          std::printf("%s\n", Json(w).c_str());
        } else {
          const std::string memory =
              w.memory_bytes() > 0 ? absl::StrFormat("%.1fG", w.memory_bytes() / double(1 << 30))
                                   : "-";
          std::printf("%-10s %-22s %-6s %-5s %-8s %-6s %-10s %s\n", Printable(w.id()).c_str(),
                      Printable(w.address()).c_str(), Printable(w.device()).c_str(),
                      w.cores() > 0 ? absl::StrCat(w.cores()).c_str() : "-", memory.c_str(), StateName(w.state()).c_str(),
                      w.job_id().empty() ? "-" : Printable(w.job_id()).c_str(),
                      w.rank() < 0 ? "-" : absl::StrCat(w.rank()).c_str());
        }
      }
      return exit_code::kOk;
    };
  });
}

// `health`: whether the coordinator serves (gRPC health check).
void AddHealth(CLI::App& app, const JobCommands& c) {
  const std::shared_ptr<Common>& common = c.common;
  const std::shared_ptr<std::function<int()>>& chosen = c.chosen;
  auto health = app.add_subcommand("health", "Whether the coordinator serves (gRPC health check)");
  c.AddCommonOptions(health);
  health->callback([=] {
    *chosen = [=]() -> int {
      Client client(*common);
      grpc::ClientContext ctx;
      client.Prepare(&ctx);
      bool serving = false;
      const grpc::Status status = rpc::CheckServing(client.channel(), &ctx, &serving);
      if (!status.ok()) return client.Fail(status, absl::StrCat("health of ", common->coordinator));
      if (common->output == "json") {
        std::printf("{\"coordinator\":\"%s\",\"serving\":%s}\n", common->coordinator.c_str(),
                    serving ? "true" : "false");
      } else {
        std::printf("%s: %s\n", common->coordinator.c_str(), serving ? "serving" : "not serving");
      }
      return serving ? exit_code::kOk : exit_code::kUnavailable;
    };
  });
}

}  // namespace

std::function<int()> AddJobCommands(CLI::App& app) {
  auto common = std::make_shared<Common>();
  const char* env = std::getenv("PIPETRAIN_COORDINATOR");
  common->coordinator = env ? env : "127.0.0.1:7070";
  auto chosen = std::make_shared<std::function<int()>>();
  const JobCommands commands{common, chosen};
  for (auto add : {AddSubmit, AddStatus, AddMetrics, AddList, AddCancel, AddStepCommands, AddLogs,
                   AddWorkers, AddHealth}) {
    add(app, commands);
  }

  return [chosen, common]() -> int {
    if (!*chosen) return -1;
    // Token and TLS files are read once, before any call; a bad one is bad usage.
    auto token = rpc::LoadToken(common->token_file);
    if (token.ok()) {
      common->security.token = *std::move(token);
      auto channel = rpc::MakeChannel(common->coordinator, common->security);
      if (channel.ok()) {
        common->channel = *std::move(channel);
        return (*chosen)();
      }
      token = channel.status();
    }
    std::fprintf(stderr, "pipetrain: %s\n", std::string(token.status().message()).c_str());
    return exit_code::kUsage;
  };
}

}  // namespace pipetrain::client
