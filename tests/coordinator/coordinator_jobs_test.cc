// A job's life on the coordinator: queued and placed, run and ended, a lost worker, a held failure,
// restarts recorded, requeued, commands, metrics. The coordinator's rules without processes,
// sockets or sleeps (coordinator_fixture.h); the daemon tests (tests/daemons) check the same rules
// end to end over gRPC.
#include "tests/coordinator/coordinator_fixture.h"

#include "absl/strings/match.h"

namespace pipetrain::coordinator::core_test {
namespace {

using ::testing::HasSubstr;

// What /metrics shows of the coordinator: jobs and workers by state, a running job's step,
// and each stage's compute per step over the median stage's (stage 1 computes 3 s a step,
// stage 0 1 s: ratios 0.5 and 1.5), step commands counted by outcome.
TEST_F(CoordinatorCoreTest, MetricsSnapshotCountsStatesAndFindsTheStraggler) {
  const std::string w1 = Register(1), w2 = Register(2);
  const v1::Job job = Submit(Spec(2));
  RunLater();
  for (int64_t t = 0; t < 4; ++t) {
    v1::StepReport r0 = Report(w1, job.id(), 0, t), r1 = Report(w2, job.id(), 1, t);
    r0.set_compute_s(1.0 * (t + 1));
    r1.set_compute_s(3.0 * (t + 1));
    r0.mutable_breakdown()->set_forward_s(0.5 * (t + 1));
    r0.mutable_breakdown()->set_last_step_bubble_ratio(0.25);
    ASSERT_TRUE(ReportSteps(sessions_[w1], {r0}).ok());
    ASSERT_TRUE(ReportSteps(sessions_[w2], {r1}).ok());
  }
  v1::SendCommandRequest command;
  command.set_job_id("job-9999");
  command.set_command(v1::STEP_COMMAND_FLUSH);
  EXPECT_FALSE(coordinator_->jobs().SendCommand(command).ok());
  const Coordinator::MetricsSnapshot m = coordinator_->Metrics();
  EXPECT_EQ(m.jobs_by_state.at("running"), 1);
  EXPECT_EQ(m.jobs_by_state.at("queued"), 0);
  EXPECT_EQ(m.workers_by_state.at("busy"), 2);
  EXPECT_EQ(m.workers_by_state.at("lost"), 0);
  ASSERT_EQ(m.running.size(), 1u);
  EXPECT_EQ(m.running[0].id, job.id());
  EXPECT_EQ(m.running[0].step, 3);
  ASSERT_EQ(m.running[0].straggler_ratio.size(), 2u);
  EXPECT_DOUBLE_EQ(m.running[0].straggler_ratio[0], 0.5);
  EXPECT_DOUBLE_EQ(m.running[0].straggler_ratio[1], 1.5);
  EXPECT_EQ(m.step_commands.at({"flush", "NOT_FOUND"}), 1);
  // The job record shows the same ratios per rank (`pipetrain metrics`), and each rank's
  // last breakdown as reported.
  const v1::Job now = Get(job.id());
  EXPECT_DOUBLE_EQ(now.stage_status(0).straggler_ratio(), 0.5);
  EXPECT_DOUBLE_EQ(now.stage_status(1).straggler_ratio(), 1.5);
  EXPECT_DOUBLE_EQ(now.stage_status(0).breakdown().forward_s(), 2.0);
  EXPECT_DOUBLE_EQ(now.stage_status(0).breakdown().last_step_bubble_ratio(), 0.25);
}

TEST_F(CoordinatorCoreTest, AQueuedJobSaysWhyItWaitsAndStartsOnWorkersWithEnoughCores) {
  auto register_with = [this](int n, int cores) {
    v1::RegisterWorkerRequest r;
    r.set_address("host-" + std::to_string(n) + ":7000");
    r.set_cores(cores);
    auto response = RegisterAsNewProcess(r);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? response->worker_id() : "";
  };
  register_with(1, 2);
  register_with(2, 2);
  v1::JobSpec spec = Spec(2);
  spec.set_threads_per_stage(4);
  const v1::Job job = Submit(spec);
  EXPECT_EQ(Get(job.id()).state(), v1::JOB_STATE_QUEUED);
  const std::string why =
      "needs 2 workers with at least 4 cores (threads_per_stage); the pool "
      "has 0 such (of 2): it waits for more to register";
  EXPECT_EQ(Get(job.id()).message(), why);
  EXPECT_THAT(EventTexts(job.id()), ::testing::Contains("queued: " + why));
  const std::string big1 = register_with(3, 8), big2 = register_with(4, 4);
  coordinator_->Tick();
  const v1::Job running = Get(job.id());
  EXPECT_EQ(running.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(running.message(), "");
  ASSERT_EQ(running.stage_status_size(), 2);
  EXPECT_EQ(running.stage_status(0).worker_id(), big1);
  EXPECT_EQ(running.stage_status(1).worker_id(), big2);
  // A worker's cores are checked like every field it sends.
  v1::RegisterWorkerRequest r;
  r.set_address("host-9:7000");
  r.set_cores(-1);
  EXPECT_EQ(RegisterAsNewProcess(r).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CoordinatorCoreTest, AJobRunsOnOneWorkerPerRankAndSucceedsWhenEveryRankEnds) {
  const std::string w1 = Register(1), w2 = Register(2);
  const v1::Job job = Submit(Spec(2));
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  RunLater();
  ASSERT_EQ(Worker(1).assigned.size(), 1u);
  ASSERT_EQ(Worker(2).assigned.size(), 1u);
  EXPECT_EQ(Worker(1).assigned[0].rank(), 0);
  EXPECT_EQ(Worker(2).assigned[0].rank(), 1);
  EndRank(w1, job.id(), 0);
  EXPECT_EQ(Get(job.id()).state(), v1::JOB_STATE_RUNNING);
  EndRank(w2, job.id(), 1);
  EXPECT_EQ(Get(job.id()).state(), v1::JOB_STATE_SUCCEEDED);
  for (const v1::WorkerInfo& w : coordinator_->workers().Workers())
    EXPECT_EQ(w.state(), v1::WORKER_STATE_IDLE);
  // Durable: the stored record says so too.
  v1::Job stored;
  ASSERT_TRUE(stored.ParseFromString(data_->jobs.at(job.id()).job));
  EXPECT_EQ(stored.state(), v1::JOB_STATE_SUCCEEDED);
}

TEST_F(CoordinatorCoreTest, AWorkerSilentForTwoIntervalsIsLostAndFailsItsJobByName) {
  const std::string w1 = Register(1), w2 = Register(2);
  const v1::Job job = Submit(Spec(2));
  RunLater();
  clock_->Advance(absl::Milliseconds(1500));
  Heartbeat(w1, job.id(), 0);
  coordinator_->Tick();
  EXPECT_EQ(Get(job.id()).state(), v1::JOB_STATE_RUNNING);  // 1.5 s of silence: not yet
  clock_->Advance(absl::Milliseconds(600));                 // worker-2: 2.1 s
  coordinator_->Tick();
  const v1::Job failed = Get(job.id());
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.message(), HasSubstr(w2 + " (host-2:7000) running stage 1 stopped sending "
                                               "heartbeats (none for 2.1s)"));
  RunLater();
  ASSERT_EQ(Worker(1).stopped.size(), 1u);  // the survivor is told to stop
  EXPECT_TRUE(Worker(2).stopped.empty());   // the lost one is not called
  std::map<std::string, v1::WorkerState> states;
  for (const v1::WorkerInfo& w : coordinator_->workers().Workers()) states[w.id()] = w.state();
  EXPECT_EQ(states[w2], v1::WORKER_STATE_LOST);
  // A lost worker's heartbeat is refused: it must register again.
  v1::HeartbeatRequest h;
  h.set_worker_id(w2);
  EXPECT_EQ(coordinator_->workers().Heartbeat(sessions_[w2], h).code(),
            absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorCoreTest, ARankFailureIsHeldBackUntilThePeersShowTheyAreAlive) {
  const std::string w1 = Register(1), w2 = Register(2);
  const v1::Job job = Submit(Spec(2));
  RunLater();
  EndRank(w1, job.id(), 0, /*ok=*/false, "lost stage 1");  // a survivor speaks first
  coordinator_->Tick();
  EXPECT_EQ(Get(job.id()).state(), v1::JOB_STATE_RUNNING);
  // Worker 2 then dies: its loss, not the survivor's complaint, is the job's cause.
  clock_->Advance(absl::Milliseconds(2100));
  coordinator_->Tick();
  EXPECT_THAT(Get(job.id()).message(), HasSubstr(w2 + " (host-2:7000) running stage 1"));
}

// A held-back rank failure that becomes the job's restarts it with that failure as the
// recovery's cause (it was once cleared before it was recorded: restarts with empty causes).
TEST_F(CoordinatorCoreTest, EveryRestartRecordsTheFailureThatCausedIt) {
  const std::string w1 = Register(1), w2 = Register(2);
  v1::JobSpec spec = Spec(2);
  spec.set_max_restarts(2);
  const v1::Job job = Submit(spec);
  RunLater();
  EndRank(w2, job.id(), 1, /*ok=*/false, "checkpoint layer 3 cannot be unpickled");
  clock_->Advance(absl::Milliseconds(600));
  Heartbeat(w1, job.id(), 0);  // the peer shows it is alive: the failure is the job's
  coordinator_->Tick();
  const v1::Job recovering = Get(job.id());
  ASSERT_EQ(recovering.recoveries_size(), 1);
  EXPECT_THAT(recovering.recoveries(0).cause(),
              HasSubstr("failed: checkpoint layer 3 cannot be unpickled"));
  EXPECT_THAT(recovering.message(), HasSubstr("checkpoint layer 3 cannot be unpickled"));
}

// The first failure to arrive gives way to a later one when it was a consequence of another
// rank's (failed_after_peer): the real cause is the job's message, not the peer's "connection
// closed" (once the job blamed the wrong rank).
TEST_F(CoordinatorCoreTest, TheRealCauseWinsOverAFailureThatFollowedIt) {
  const std::string w1 = Register(1), w2 = Register(2);
  const v1::Job job = Submit(Spec(2));
  RunLater();
  v1::StageEnd consequence;
  consequence.set_worker_id(w2);
  consequence.set_job_id(job.id());
  consequence.set_rank(1);
  consequence.set_error(
      "rank 0 (stage 0) failed first: layer 1 cannot be unpickled (here: "
      "Connection closed by peer)");
  consequence.set_failed_after_peer(true);
  ASSERT_TRUE(coordinator_->reports().ReportStageEnd(sessions_[w2], consequence).ok());
  EndRank(w1, job.id(), 0, /*ok=*/false, "layer 1 cannot be unpickled");
  const v1::Job failed = Get(job.id());
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(failed.message(), "stage 0 on " + w1 + " failed: layer 1 cannot be unpickled");
}

// A recovering job that cannot be placed holds no worker: once its last ranks ended and its
// grace passed, a queued job starts on the idle worker it cannot use, and its status says
// why it waits (it once held the queue, silently, for up to its timeout_s).
TEST_F(CoordinatorCoreTest, ARecoveringJobThatCannotBePlacedDoesNotHoldTheQueue) {
  const std::string w1 = Register(1), w2 = Register(2);
  v1::JobSpec fixed = Spec(2);
  fixed.set_max_restarts(2);
  fixed.set_timeout_s(3600);
  fixed.clear_stages();
  auto* first = fixed.add_stage_ranges();  // two fixed stages: no smaller layout
  first->set_begin(0);
  first->set_end(2);
  auto* second = fixed.add_stage_ranges();
  second->set_begin(2);
  second->set_end(5);
  const v1::Job a = Submit(fixed);
  RunLater();
  ASSERT_EQ(Get(a.id()).state(), v1::JOB_STATE_RUNNING);
  // worker-2 goes silent: a is recovering, its rank on worker-1 is stopped and ends.
  clock_->Advance(absl::Milliseconds(1500));
  Heartbeat(w1, a.id(), 0);
  clock_->Advance(absl::Milliseconds(600));
  coordinator_->Tick();
  RunLater();
  EndRank(w1, a.id(), 0, /*ok=*/false, "stopped", Get(a.id()).generation());
  const v1::Job b = Submit(Spec(1));
  EXPECT_EQ(Get(b.id()).state(), v1::JOB_STATE_QUEUED);  // within a's grace
  for (int i = 0; i < 4; ++i) {
    clock_->Advance(absl::Milliseconds(900));
    Heartbeat(w1);
    coordinator_->Tick();
  }
  RunLater();
  EXPECT_EQ(Get(b.id()).state(), v1::JOB_STATE_RUNNING);
  const v1::Job waiting = Get(a.id());
  EXPECT_EQ(waiting.state(), v1::JOB_STATE_RUNNING);
  EXPECT_THAT(waiting.message(), HasSubstr("recovering (restart 1 of 2): " + w2));
  EXPECT_THAT(waiting.message(), HasSubstr("; waits for workers to restart on: "));
  EXPECT_THAT(waiting.message(), HasSubstr("up to timeout_s (1h)"));
}

// Two jobs never write checkpoints into one directory: a job without checkpoint.dir gets its
// own (checkpoints/<id>, in its spec); a directory a queued or running job uses is refused
// naming that job, and is free again once it ended; resume_from: latest needs a directory.
TEST_F(CoordinatorCoreTest, TwoJobsNeverShareACheckpointDirectory) {
  const std::string w1 = Register(1), w2 = Register(2);
  const v1::Job a = Submit(Spec(2));
  EXPECT_EQ(a.spec().checkpoint().dir(), "checkpoints/" + a.id());
  const v1::Job b = Submit(Spec(2));  // queued behind a, in a directory of its own
  EXPECT_EQ(b.spec().checkpoint().dir(), "checkpoints/" + b.id());
  v1::JobSpec shared = Spec(2);
  shared.mutable_checkpoint()->set_dir("/shared/ckpt");
  const v1::Job c = Submit(shared);
  EXPECT_EQ(c.spec().checkpoint().dir(), "/shared/ckpt");
  for (const char* same : {"/shared/ckpt", "/shared//ckpt/", "/shared/x/../ckpt"}) {
    v1::JobSpec again = Spec(2);
    again.mutable_checkpoint()->set_dir(same);
    absl::StatusOr<v1::Job> refused = coordinator_->jobs().Submit(again, "");
    ASSERT_FALSE(refused.ok()) << same;
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(refused.status().message()),
                HasSubstr("holds the checkpoints of " + c.id() + " (queued)"));
  }
  v1::JobSpec own_of_a = Spec(2);
  own_of_a.mutable_checkpoint()->set_dir("checkpoints/" + a.id());
  EXPECT_FALSE(coordinator_->jobs().Submit(own_of_a, "").ok());  // a runs
  v1::JobSpec latest = Spec(2);
  latest.set_resume_from("latest");
  absl::StatusOr<v1::Job> no_dir = coordinator_->jobs().Submit(latest, "");
  ASSERT_FALSE(no_dir.ok());
  EXPECT_THAT(std::string(no_dir.status().message()), HasSubstr("needs checkpoint.dir"));
  // Once c ended its directory may be resumed from (and written to) by another job.
  ASSERT_TRUE(coordinator_->jobs().Cancel(c.id()).ok());
  shared.set_resume_from("latest");
  EXPECT_TRUE(coordinator_->jobs().Submit(shared, "").ok());
}

// A busy worker's address is not taken by another registration while that worker still
// answers there with its key (a holder of the join token once failed its job that way); a
// worker restarted on the address (the old process gone) takes it over at once; a
// registration without a command key is refused.
TEST_F(CoordinatorCoreTest, AnAddressIsTakenOverOnlyFromAWorkerThatNoLongerAnswers) {
  Register(1);
  const std::string w2 = Register(2);
  const v1::Job job = Submit(Spec(2));
  RunLater();
  v1::RegisterWorkerRequest rogue;
  rogue.set_address("host-2:7000");
  rogue.set_command_key(std::string(32, 'a'));  // the process at host-2 still holds its own
  absl::StatusOr<v1::RegisterWorkerResponse> refused = coordinator_->workers().Register(rogue);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("is held by " + w2));
  EXPECT_EQ(Get(job.id()).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Get(job.id()).restarts(), 0);
  v1::RegisterWorkerRequest keyless;
  keyless.set_address("host-7:7000");
  EXPECT_EQ(coordinator_->workers().Register(keyless).status().code(),
            absl::StatusCode::kInvalidArgument);
  // The worker at host-2 restarts: the new process there answers with another key.
  v1::RegisterWorkerRequest restarted;
  restarted.set_address("host-2:7000");
  absl::StatusOr<v1::RegisterWorkerResponse> back = RegisterAsNewProcess(restarted);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_NE(back->worker_id(), w2);
  EXPECT_THAT(Get(job.id()).message(), HasSubstr("it restarted"));
}

// Workers registering one by one while a job waits for them change only the counts of why it
// waits: its status says the latest, its events the reason once (not once per worker, which
// for thousands of workers flooded the event log and the store).
TEST_F(CoordinatorCoreTest, AJobWaitingForWorkersSaysWhyOnceAndCountsInItsStatus) {
  const v1::Job job = Submit(Spec(4));
  for (int n = 1; n <= 3; ++n) Register(n);
  EXPECT_EQ(Get(job.id()).state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(Get(job.id()).message(),
            "needs 4 workers; the pool has 3: it waits for more to register");
  int waiting_events = 0;
  for (const std::string& text : EventTexts(job.id())) {
    waiting_events += absl::StartsWith(text, "queued: needs 4 workers; the pool has");
  }
  EXPECT_EQ(waiting_events, 1);
  Register(4);
  EXPECT_EQ(Get(job.id()).state(), v1::JOB_STATE_RUNNING);
}

TEST_F(CoordinatorCoreTest, QueuedJobsStartInOrderWithBackfill) {
  const std::string w1 = Register(1), w2 = Register(2), w3 = Register(3);
  const v1::Job a = Submit(Spec(2));
  const v1::Job b = Submit(Spec(2));  // 1 worker left: waits
  const v1::Job c = Submit(Spec(1));  // fits in it: starts before b
  EXPECT_EQ(Get(a.id()).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Get(b.id()).state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(Get(c.id()).state(), v1::JOB_STATE_RUNNING);
  EXPECT_THAT(EventTexts(b.id()), ::testing::Contains("queued: needs 2 workers, 1 idle"));
  RunLater();
  EndRank(w1, a.id(), 0);
  EndRank(w2, a.id(), 1);
  EXPECT_EQ(Get(a.id()).state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(Get(b.id()).state(), v1::JOB_STATE_RUNNING);  // on the two workers a freed
  RunLater();
  EXPECT_EQ(Worker(1).assigned.back().job_id(), b.id());
  EXPECT_EQ(Worker(2).assigned.back().job_id(), b.id());
}

// A worker that registered and heartbeats but cannot be reached: with no other idle worker
// the job goes back to the queue saying why (it once failed: "assigning ... Deadline
// Exceeded"), its other rank is stopped and freed, the unreachable worker is lost, and the job
// starts again, as the next generation, once a worker registers.
TEST_F(CoordinatorCoreTest, AnUnreachableWorkerRequeuesTheJobToWaitForAnother) {
  Register(1);
  const std::string w2 = Register(2);
  Worker(1).fail_assign = true;
  const v1::Job job = Submit(Spec(2));
  RunLater();
  const v1::Job requeued = Get(job.id());
  EXPECT_EQ(requeued.state(), v1::JOB_STATE_QUEUED);
  EXPECT_THAT(requeued.message(),
              HasSubstr("requeued: assigning stage 0 to worker-1 failed: connection refused"));
  EXPECT_EQ(requeued.restarts(), 0);
  ASSERT_EQ(Worker(2).stopped.size(), 1u);
  EndRank(w2, job.id(), 1, false, "stopped", requeued.generation());
  // The unreachable worker is lost (never chosen again until it registers again); the other
  // is free.
  std::map<std::string, v1::WorkerState> states;
  for (const v1::WorkerInfo& w : coordinator_->workers().Workers()) states[w.id()] = w.state();
  EXPECT_EQ(states["worker-1"], v1::WORKER_STATE_LOST);
  EXPECT_EQ(states[w2], v1::WORKER_STATE_IDLE);
  EXPECT_EQ(Get(job.id()).state(), v1::JOB_STATE_QUEUED);
  const std::string w3 = Register(3);
  RunLater();
  const v1::Job again = Get(job.id());
  EXPECT_EQ(again.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(again.generation(), requeued.generation() + 1);
  ASSERT_EQ(Worker(3).assigned.size(), 1u);
  EXPECT_EQ(Worker(3).assigned[0].generation(), again.generation());
}

// An assignment a worker cannot take (unreachable) goes to another idle worker, a bounded
// number of times; the job runs on the workers that took it.
TEST_F(CoordinatorCoreTest, AFailedAssignmentIsRetriedOnAnotherIdleWorker) {
  Register(1);
  Register(2);
  Register(3);
  Worker(1).fail_assign = true;
  const v1::Job job = Submit(Spec(2));
  RunLater();
  const v1::Job running = Get(job.id());
  EXPECT_EQ(running.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(running.stage_status(0).worker_id(), "worker-3");
  EXPECT_EQ(running.stage_status(1).worker_id(), "worker-2");
  ASSERT_EQ(Worker(3).assigned.size(), 1u);
  EXPECT_EQ(Worker(3).assigned[0].rank(), 0);
  EXPECT_THAT(EventTexts(job.id()),
              ::testing::Contains(HasSubstr("assigning stage 0 to worker-1 failed: connection "
                                            "refused; assigned to worker-3 instead")));
  // Every worker unreachable: a rank is tried on assign_attempts (3) workers, then the job
  // waits in the queue; placed again on the idle ones left, it ends up having tried each
  // unreachable worker once (each is lost then), and waits for a worker that can be reached.
  for (int n = 4; n <= 8; ++n) Register(n);
  for (int n = 4; n <= 8; ++n) Worker(n).fail_assign = true;
  const v1::Job doomed = Submit(Spec(1));
  RunLater();
  EXPECT_EQ(Get(doomed.id()).state(), v1::JOB_STATE_QUEUED);
  EXPECT_THAT(Get(doomed.id()).message(), HasSubstr("requeued: assigning stage 0"));
  for (int n = 4; n <= 8; ++n) EXPECT_EQ(Worker(n).assigned.size(), 1u) << "worker " << n;
  for (const v1::WorkerInfo& w : coordinator_->workers().Workers()) {
    if (w.address() >= "host-4") {
      EXPECT_EQ(w.state(), v1::WORKER_STATE_LOST) << w.id();
    }
  }
}

// A worker that stops on purpose leaves at once (the rank it ran is lost, naming why); one
// that is lost is listed as lost, then forgotten after the TTL; one registering again from
// the same address replaces its old entry.
TEST_F(CoordinatorCoreTest, WorkersLeaveWhenStoppedAreForgottenWhenLostAndReplacedWhenBack) {
  const std::string w1 = Register(1), w2 = Register(2);
  const v1::Job job = Submit(Spec(2));
  RunLater();
  v1::DeregisterWorkerRequest leave;
  leave.set_worker_id(w2);
  EXPECT_EQ(coordinator_->workers().Deregister(sessions_[w1], leave).code(),
            absl::StatusCode::kPermissionDenied);  // not for another worker
  EXPECT_TRUE(coordinator_->workers().Deregister(sessions_[w2], leave).ok());
  const v1::Job failed = Get(job.id());
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.message(),
              HasSubstr(w2 + " (host-2:7000) running stage 1 stopped (it was shut "
                             "down)"));
  EXPECT_EQ(coordinator_->workers().Workers().size(), 1u);

  // Lost, listed as lost, then forgotten (TTL 1 minute).
  clock_->Advance(absl::Seconds(3));
  coordinator_->Tick();
  ASSERT_EQ(coordinator_->workers().Workers().size(), 1u);
  EXPECT_EQ(coordinator_->workers().Workers()[0].state(), v1::WORKER_STATE_LOST);
  clock_->Advance(absl::Seconds(61));
  coordinator_->Tick();
  EXPECT_TRUE(coordinator_->workers().Workers().empty());

  // Registering twice from one address: one entry, the newest.
  const std::string first = Register(5), second = Register(5);
  ASSERT_NE(first, second);
  const std::vector<v1::WorkerInfo> workers = coordinator_->workers().Workers();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0].id(), second);
  v1::HeartbeatRequest h;
  h.set_worker_id(first);
  EXPECT_EQ(coordinator_->workers().Heartbeat(sessions_[first], h).code(),
            absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorCoreTest, StepCommandsGoToTheWorkerOfRankZero) {
  Register(1);
  Register(2);
  const v1::Job job = Submit(Spec(2));
  RunLater();
  v1::SendCommandRequest r;
  r.set_job_id(job.id());
  r.set_command(v1::STEP_COMMAND_FLUSH);
  r.set_step(3);
  auto response = coordinator_->jobs().SendCommand(r);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->step(), 3);
  EXPECT_EQ(Worker(1).commands.size(), 1u);
  EXPECT_TRUE(Worker(2).commands.empty());
  EXPECT_THAT(EventTexts(job.id()), ::testing::Contains("flush scheduled before step 3"));
  // Refused for a job that does not run, and for an unknown one.
  r.set_job_id("job-0099");
  EXPECT_EQ(coordinator_->jobs().SendCommand(r).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorCoreTest, ARestartFailsTheRunningJobsAndKeepsTheRest) {
  const std::string w1 = Register(1);
  const v1::Job done = Submit(Spec(1));
  RunLater();
  EndRank(w1, done.id(), 0);
  const v1::Job running = Submit(Spec(1));
  RunLater();
  coordinator_.reset();  // the coordinator goes; its store stays
  Open();
  EXPECT_EQ(Get(done.id()).state(), v1::JOB_STATE_SUCCEEDED);
  const v1::Job interrupted = Get(running.id());
  EXPECT_EQ(interrupted.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(interrupted.message(), HasSubstr("interrupted by a coordinator restart"));
  EXPECT_THAT(EventTexts(running.id()).back(), HasSubstr("interrupted by a coordinator restart"));
  // Ids are never handed out twice: the next worker and job get new ones (worker numbers
  // come in blocks of kWorkerNumberBlock: the restarted coordinator starts the next block).
  EXPECT_EQ(Register(2), absl::StrCat("worker-", WorkerManager::kWorkerNumberBlock + 1));
  EXPECT_EQ(Submit(Spec(1)).id(), "job-0003");
}

}  // namespace
}  // namespace pipetrain::coordinator::core_test
