// The coordinator's Prometheus series, all read from Coordinator::Metrics() at scrape time
// (nothing is updated on a handler's path but the RPC timings of rpc/metrics_interceptor.h):
//   pipetrain_jobs{state}, pipetrain_workers{state}
//   pipetrain_job_step{job_id}, pipetrain_job_tokens_per_second{job_id},
//   pipetrain_job_loss{job_id} (from the last stage), pipetrain_job_straggler_ratio{job_id,
//   pp_stage} (a stage's compute per step, averaged over recent steps, over the median
//   stage's), for running jobs
//   pipetrain_workers_lost_total (heartbeats missed), pipetrain_step_commands_total{command,
//   outcome}, pipetrain_build_info{version, daemon}
#pragma once

#include "coordinator/coordinator.h"
#include "metrics/metrics.h"

namespace pipetrain::coordinator {

// `coordinator` must outlive every scrape of `registry`.
void RegisterCoordinatorMetrics(metrics::Registry* registry, Coordinator* coordinator);

}  // namespace pipetrain::coordinator
