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

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/job_client.h"
#include "client/job_views.h"
#include "client/local_cluster.h"
#include "client/stage_breakdown.h"
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
#include "runtime/job/job_spec.h"

namespace pipetrain::client {

namespace {

// What the job commands share: the options every one takes, and the one chosen on the
// command line (set by its callback, run once the token and TLS files are read).
struct JobCommands {
  std::shared_ptr<ClientOptions> common;
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
  const std::shared_ptr<ClientOptions>& common = c.common;
  const std::shared_ptr<std::function<int()>>& chosen = c.chosen;
  auto submit = app.add_subcommand(
      "submit",
      "Submit a job to the coordinator (a YAML job file, the flags below over it; "
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
      if (absl::Status valid = job::Validated(*spec).status(); !valid.ok()) {
        std::fprintf(stderr, "pipetrain: %s: %s\n", what.c_str(),
                     std::string(valid.message()).c_str());
        return exit_code::For(valid);
      }
      JobClient client(*common);
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
      return *follow ? FollowJobStream(client, job.id(), common->output == "json") : 0;
    };
  });
}

// `status`: a job's state and per-stage table.
void AddStatus(CLI::App& app, const JobCommands& c) {
  const std::shared_ptr<ClientOptions>& common = c.common;
  const std::shared_ptr<std::function<int()>>& chosen = c.chosen;
  auto status = app.add_subcommand("status", "A job's state and per-stage table");
  auto status_id = std::make_shared<std::string>();
  status->add_option("job", *status_id, "job id")->required();
  c.AddCommonOptions(status);
  status->callback([=] {
    *chosen = [=]() -> int {
      JobClient client(*common);
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
  const std::shared_ptr<ClientOptions>& common = c.common;
  const std::shared_ptr<std::function<int()>>& chosen = c.chosen;
  auto metrics = app.add_subcommand(
      "metrics",
      "Where each stage of a job spends a step: compute, receive and send time, exposed "
      "AllReduce, bubble and straggler ratios, peak memory (from the coordinator; no "
      "Prometheus needed)");
  auto id = std::make_shared<std::string>();
  auto watch_s = std::make_shared<double>(0);
  metrics->add_option("job", *id, "job id")->required();
  metrics
      ->add_option("-w,--watch", *watch_s,
                   "print again every this many seconds while the job runs (0: once)")
      ->check(CLI::Range(0.0, 3600.0));
  c.AddCommonOptions(metrics);
  metrics->callback([=] {
    *chosen = [=]() -> int {
      JobClient client(*common);
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
  const std::shared_ptr<ClientOptions>& common = c.common;
  const std::shared_ptr<std::function<int()>>& chosen = c.chosen;
  auto list = app.add_subcommand("list", "Every job, oldest first");
  c.AddCommonOptions(list);
  list->callback([=] {
    *chosen = [=]() -> int {
      JobClient client(*common);
      v1::ListJobsRequest request;  // page after page: no answer nears the message limit
      do {
        v1::ListJobsResponse response;
        grpc::Status s = client.Call(&v1::JobService::Stub::ListJobs, request, &response);
        if (!s.ok()) return client.Fail(s, "list");
        if (common->output == "table" && request.page_token().empty()) {  // after the first
          std::printf("%-10s %-10s %-11s %-12s %-10s %s\n", "id", "state", "step", "loss", "layout",
                      "name");
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
  const std::shared_ptr<ClientOptions>& common = c.common;
  const std::shared_ptr<std::function<int()>>& chosen = c.chosen;
  auto cancel = app.add_subcommand("cancel", "Cancel a queued or running job");
  auto cancel_id = std::make_shared<std::string>();
  cancel->add_option("job", *cancel_id, "job id")->required();
  c.AddCommonOptions(cancel);
  cancel->callback([=] {
    *chosen = [=]() -> int {
      JobClient client(*common);
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
  const std::shared_ptr<ClientOptions>& common = c.common;
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
       "Drain before a step and write a checkpoint of every layer (weights, optimizer state; "
       "2BW also the older version the step runs on; weights unchanged) to "
       "<checkpoint.dir>/step-N/ (the job's checkpoint.dir; by default checkpoints/JOB-ID)"},
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
        ->check(CLI::Validator(
            [](std::string& text) -> std::string {
              int64_t step = 0;
              return absl::SimpleAtoi(text, &step) && step >= 0
                         ? std::string()
                         : "must be a step number, 0 or more (0: the earliest possible)";
            },
            "STEP"));
    c.AddCommonOptions(cmd);
    const v1::StepCommand command = verb.command;
    const std::string name = verb.name;
    cmd->callback([=] {
      *chosen = [=]() -> int {
        JobClient client(*common);
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
  const std::shared_ptr<ClientOptions>& common = c.common;
  const std::shared_ptr<std::function<int()>>& chosen = c.chosen;
  auto logs = app.add_subcommand("logs", "A job's events");
  auto logs_id = std::make_shared<std::string>();
  auto logs_follow = std::make_shared<bool>(false);
  logs->add_option("job", *logs_id, "job id")->required();
  logs->add_flag("-f,--follow", *logs_follow, "keep printing until the job ends");
  c.AddCommonOptions(logs);
  logs->callback([=] {
    *chosen = [=]() -> int {
      JobClient client(*common);
      grpc::ClientContext ctx;
      if (!*logs_follow) {
        client.SetDeadline(&ctx);
      } else if (grpc::Status reached = client.WaitForCoordinator(); !reached.ok()) {
        // The stream has no deadline (it lasts as long as the job); reaching it does.
        return client.Fail(reached, "logs");
      }
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
  const std::shared_ptr<ClientOptions>& common = c.common;
  const std::shared_ptr<std::function<int()>>& chosen = c.chosen;
  auto workers = app.add_subcommand("workers", "The worker pool");
  c.AddCommonOptions(workers);
  workers->callback([=] {
    *chosen = [=]() -> int {
      JobClient client(*common);
      v1::ListWorkersResponse response;
      grpc::Status s =
          client.Call(&v1::JobService::Stub::ListWorkers, v1::ListWorkersRequest(), &response);
      if (!s.ok()) return client.Fail(s, "workers");
      if (common->output == "table") {
        std::printf("%-10s %-22s %-16s %-6s %-5s %-8s %-6s %-10s %s\n", "id", "address", "host",
                    "device", "cores", "memory", "state", "job", "rank");
      }
      for (const v1::WorkerInfo& w : response.workers()) {
        if (common->output == "json") {
          std::printf("%s\n", Json(w).c_str());
        } else {
          const std::string memory =
              w.memory_bytes() > 0 ? absl::StrFormat("%.1fG", w.memory_bytes() / double(1 << 30))
                                   : "-";
          std::printf(
              "%-10s %-22s %-16s %-6s %-5s %-8s %-6s %-10s %s\n", Printable(w.id()).c_str(),
              Printable(w.address()).c_str(), w.host().empty() ? "-" : Printable(w.host()).c_str(),
              Printable(w.device()).c_str(), w.cores() > 0 ? absl::StrCat(w.cores()).c_str() : "-",
              memory.c_str(), StateName(w.state()).c_str(),
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
  const std::shared_ptr<ClientOptions>& common = c.common;
  const std::shared_ptr<std::function<int()>>& chosen = c.chosen;
  auto health = app.add_subcommand("health", "Whether the coordinator serves (gRPC health check)");
  c.AddCommonOptions(health);
  health->callback([=] {
    *chosen = [=]() -> int {
      JobClient client(*common);
      grpc::ClientContext ctx;
      client.SetDeadline(&ctx);
      bool serving = false;
      // The coordinator's own service, not the server's: a worker's port serves health too.
      grpc::Status status =
          rpc::CheckServing(client.channel(), &ctx, &serving, "pipetrain.v1.JobService");
      if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
        status = grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                              "its health service knows no pipetrain.v1.JobService");
      }
      if (!status.ok()) return client.Fail(status, "health");
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
  auto common = std::make_shared<ClientOptions>();
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