// Which queued jobs start now, and on which workers (one rank per worker).
//
// Jobs are taken in submission order; a job starts when as many workers as it has ranks are
// idle, rank r on the r-th idle worker left. A job that does not fit waits, and a later,
// smaller job that does fit starts before it (backfill). Pure: no clock, no lock, no I/O.
#pragma once

#include <string>
#include <vector>

namespace pipetrain::coordinator {

struct QueuedJob {
  std::string id;
  int ranks = 0;  // stages x replicas: the workers it needs
};

struct Placement {
  std::string job_id;
  std::vector<std::string> rank_workers;  // worker id of each rank
};

struct PlacementPlan {
  std::vector<Placement> started;    // in submission order
  std::vector<std::string> waiting;  // ids of the jobs that do not fit, in submission order
};

PlacementPlan PlaceQueuedJobs(const std::vector<QueuedJob>& queued_in_order,
                              std::vector<std::string> idle_workers);

}  // namespace pipetrain::coordinator
