// How the CLI shows a job: its table (`pipetrain status`), its progress line while it runs,
// and following it to its end over WatchJob. Writes to stdout/stderr; not thread-safe.
#pragma once

#include <string>

#include "client/job_client.h"
#include "client/stage_breakdown.h"
#include "pipetrain/v1/job.pb.h"
#include "runtime/base/progress_line.h"

namespace pipetrain::client {

// The job's state, step, loss and rate, its plan and restarts, the per-rank table, and for a
// running job with waiting ranks who waits for whom.
void PrintJobTable(const v1::Job& job);

// Where `job` is, for the progress line; its elapsed time from the coordinator's clock (to
// now while it runs).
progress::Progress ProgressOf(const v1::Job& job);

// Follows job `id` until it ends: each update as a line of JSON on stdout (`json`), else the
// progress line on stderr (unless `quiet`), then "job ID STATE" on stdout. 0 if it
// succeeded, 1 if it failed or was cancelled, the call's exit code if the stream broke.
int FollowJobStream(JobClient& client, const std::string& id, bool json, bool quiet = false);

}  // namespace pipetrain::client
