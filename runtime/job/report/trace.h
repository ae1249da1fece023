// A run's timeline in the Chrome trace event format (JSON), for chrome://tracing or
// ui.perfetto.dev: one process per data-parallel replica, one thread per stage, a span per
// executed action (its receive wait as an argument) and per gradient AllReduce (bucket
// number as an argument), on the clock of MonotonicSeconds() relative to the run's start.
#pragma once

#include <string>

#include "runtime/job/report/report.h"

namespace pipetrain::job {

// Needs report.stage_stats (every replica's measurements, index replica * stages + stage).
std::string ChromeTraceJson(const JobReport& report);

}  // namespace pipetrain::job
