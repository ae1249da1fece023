#include "coordinator/coordinator_metrics.h"

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace pipetrain::coordinator {

void RegisterCoordinatorMetrics(metrics::Registry* registry, Coordinator* coordinator) {
  using Samples = std::vector<metrics::CollectedSample>;
  registry
      ->GetGauge("pipetrain_build_info", "1, labelled with the build's version.",
                 {"version", "daemon"}, {PIPETRAIN_VERSION, "coordinator"})
      .Set(1);
  // One snapshot serves every family of a scrape (they are collected one after another, in
  // well under 100 ms), so a scrape takes the coordinator's lock for one pass over its jobs.
  struct Cache {
    std::mutex mu;
    std::chrono::steady_clock::time_point taken;
    Coordinator::MetricsSnapshot snapshot;
  };
  auto cache = std::make_shared<Cache>();
  auto snapshot = [coordinator, cache] {
    std::lock_guard<std::mutex> lock(cache->mu);
    const auto now = std::chrono::steady_clock::now();
    if (now - cache->taken > std::chrono::milliseconds(100)) {
      cache->snapshot = coordinator->Metrics();
      cache->taken = now;
    }
    return cache->snapshot;
  };
  registry->AddCollector("pipetrain_jobs", "Jobs by state.", {"state"}, [snapshot] {
    Samples out;
    for (const auto& [state, n] : snapshot().jobs_by_state) out.push_back({{state}, double(n)});
    return out;
  });
  registry->AddCollector("pipetrain_workers", "Workers by state.", {"state"}, [snapshot] {
    Samples out;
    for (const auto& [state, n] : snapshot().workers_by_state) {
      out.push_back({{state}, double(n)});
    }
    return out;
  });
  registry->AddCollector("pipetrain_job_step", "Last step every rank of a running job finished.",
                         {"job_id"}, [snapshot] {
                           Samples out;
                           for (const auto& j : snapshot().running) {
                             out.push_back({{j.id}, double(j.step)});
                           }
                           return out;
                         });
  registry->AddCollector(
      "pipetrain_job_tokens_per_second",
      "Tokens (samples for classification data) a running job processes per second.", {"job_id"},
      [snapshot] {
        Samples out;
        for (const auto& j : snapshot().running) out.push_back({{j.id}, j.tokens_per_s});
        return out;
      });
  // A gauge per running job of one of its optional figures (absent: no sample for the job).
  using RunningJob = Coordinator::MetricsSnapshot::RunningJob;
  const auto add_job_gauge = [&](const char* name, const char* help,
                                 std::optional<double> RunningJob::*figure) {
    registry->AddCollector(name, help, {"job_id"}, [snapshot, figure] {
      Samples out;
      for (const auto& j : snapshot().running) {
        if (j.*figure) out.push_back({{j.id}, *(j.*figure)});
      }
      return out;
    });
  };
  add_job_gauge("pipetrain_job_loss",
                "Mean loss of a running job's last step (from its last stage).", &RunningJob::loss);
  add_job_gauge("pipetrain_job_learning_rate",
                "The learning rate a running job's last step's update used (the optimizer's "
                "schedule).",
                &RunningJob::learning_rate);
  add_job_gauge("pipetrain_job_grad_norm",
                "The 2-norm of a running job's last step's whole gradient before clipping "
                "(jobs that clip their gradients).",
                &RunningJob::grad_norm);
  add_job_gauge("pipetrain_job_eval_loss",
                "A running job's latest mean loss on held-out data (jobs with eval.every).",
                &RunningJob::eval_loss);
  add_job_gauge("pipetrain_job_eval_accuracy",
                "A running job's latest accuracy on held-out data: the fraction of targets its "
                "argmax predicts (jobs with eval.every).",
                &RunningJob::eval_accuracy);
  registry->AddCollector(
      "pipetrain_job_straggler_ratio",
      "A stage's compute seconds per step (recent average) over the median stage's (1: "
      "balanced).",
      {"job_id", "pp_stage"}, [snapshot] {
        Samples out;
        for (const auto& j : snapshot().running) {
          for (size_t s = 0; s < j.straggler_ratio.size(); ++s) {
            out.push_back({{j.id, std::to_string(s)}, j.straggler_ratio[s]});
          }
        }
        return out;
      });
  registry->AddCollector(
      "pipetrain_workers_lost_total",
      "Workers declared lost because their heartbeats stopped, since the coordinator started.", {},
      [snapshot] {
        return Samples{{{}, double(snapshot().workers_lost_silent)}};
      },
      metrics::Registry::Type::kCounter);
  registry->AddCollector(
      "pipetrain_coordinator_stalls_total",
      "Times this coordinator found it had not run for over half a heartbeat interval "
      "(stopped, swapped out, starved of CPU) and did not count that time as its workers' "
      "silence.",
      {},
      [snapshot] {
        return Samples{{{}, double(snapshot().coordinator_stalls)}};
      },
      metrics::Registry::Type::kCounter);
  registry->AddCollector(
      "pipetrain_step_commands_total",
      "Step commands asked for, by command and outcome (scheduled, or the refusal's code).",
      {"command", "outcome"},
      [snapshot] {
        Samples out;
        for (const auto& [key, n] : snapshot().step_commands) {
          out.push_back({{key.first, key.second}, double(n)});
        }
        return out;
      },
      metrics::Registry::Type::kCounter);
}

}  // namespace pipetrain::coordinator
