// Recovery: the next generation from the checkpoint, shrinking after the grace, memory for a rank,
// skipped steps, a coordinator restart, store writes that fail. The coordinator's rules without
// processes, sockets or sleeps (coordinator_fixture.h); the daemon tests (tests/daemons) check the
// same rules end to end over gRPC.
#include "tests/coordinator/coordinator_fixture.h"

namespace pipetrain::coordinator::core_test {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;

// Recovery (coordinator.h): a fault ends generation 1; once its survivors have ended, the
// job runs generation 2 from the newest checkpoint committed with every step before it;
// the earlier generation's reports change nothing; each step is committed once.
TEST_F(CoordinatorCoreTest, AFaultRestartsTheJobFromItsCheckpointAsTheNextGeneration) {
  const RecoverableJob started = StartRecoverableJob(10);
  const std::string &w1 = started.w1, &w2 = started.w2, &w3 = started.w3;
  const v1::Job& job = started.job;
  ASSERT_EQ(Worker(1).assigned.size(), 1u);
  EXPECT_EQ(Worker(1).assigned[0].generation(), 1);
  EXPECT_EQ(Get(job.id()).generation(), 1);
  // Steps 0..4; rank 0 committed the checkpoint before step 3 (reported with step 2).
  for (int64_t t = 0; t < 5; ++t) {
    v1::StepReport r0 = Report(w1, job.id(), 0, t);
    if (t == 2) r0.set_checkpoint_committed("/ckpt/step-00000003");
    ASSERT_TRUE(ReportSteps(sessions_[w1], {r0}).ok());
    v1::StepReport r1 = Report(w2, job.id(), 1, t);
    r1.set_has_loss(true);
    r1.set_loss(10.0 - t);
    ASSERT_TRUE(ReportSteps(sessions_[w2], {r1}).ok());
  }
  EXPECT_EQ(Get(job.id()).checkpoint_step(), 3);
  EXPECT_EQ(Get(job.id()).checkpoint_path(), "/ckpt/step-00000003");
  // worker-2 goes silent: the job is not failed, it recovers.
  SilenceWorkerTwo(started);
  v1::Job recovering = Get(job.id());
  EXPECT_EQ(recovering.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(recovering.restarts(), 1);
  EXPECT_THAT(recovering.message(), HasSubstr("recovering (restart 1 of 1): " + w2));
  ASSERT_EQ(recovering.recoveries_size(), 1);
  EXPECT_EQ(recovering.recoveries(0).generation(), 2);
  EXPECT_EQ(recovering.recoveries(0).failed_after_step(), 4);
  EXPECT_EQ(recovering.recoveries(0).resumed_at_step(), 3);
  EXPECT_EQ(recovering.step(), 2);  // steps 3 and 4 are run again
  RunLater();
  ASSERT_EQ(Worker(1).stopped.size(), 1u);
  EXPECT_EQ(Worker(1).stopped[0].generation(), 1);
  // Not placed while the survivor's stage has not ended; its late report is ignored.
  EXPECT_TRUE(Worker(3).assigned.empty());
  v1::StepReport late = Report(w1, job.id(), 0, 5);
  late.set_generation(1);
  EXPECT_TRUE(ReportSteps(sessions_[w1], {late}).ok());
  EXPECT_EQ(Get(job.id()).step(), 2);
  EndRank(w1, job.id(), 0, /*ok=*/false, "stopped", /*generation=*/1);
  RunLater();
  // Nor while worker-2 may still run rank 1 (cut off from here, not from its peers): its
  // lease is three intervals from its last heartbeat, and an interval to stop.
  EXPECT_TRUE(Worker(3).assigned.empty());
  EXPECT_THAT(Get(job.id()).message(), HasSubstr("a lost worker's lease first"));
  PassSeconds(2, {w1, w3});
  // Generation 2 on worker-1 and worker-3 (both idle), resuming from the checkpoint.
  ASSERT_EQ(Worker(1).assigned.size(), 2u);
  ASSERT_EQ(Worker(3).assigned.size(), 1u);
  for (const v1::StageAssignment* a : {&Worker(1).assigned[1], &Worker(3).assigned[0]}) {
    EXPECT_EQ(a->generation(), 2);
    EXPECT_EQ(a->spec().resume_from(), "/ckpt/step-00000003");
  }
  const std::string r0_worker = Worker(1).assigned[1].rank() == 0 ? w1 : w3;
  const std::string r1_worker = r0_worker == w1 ? w3 : w1;
  EXPECT_EQ(Get(job.id()).generation(), 2);
  // Generation 1's ranks meet no more: the store is generation 2's alone.
  EXPECT_EQ(coordinator_->workers().Rendezvous(sessions_[w1], job.id(), 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(coordinator_->workers().Rendezvous(sessions_[w1], job.id(), 2).ok());
  // Its ranks start at the checkpoint's step: an earlier one counts as resent (skipped), a
  // later one is refused.
  v1::StepReport early = Report(r0_worker, job.id(), 0, 2);
  early.set_generation(2);
  EXPECT_TRUE(ReportSteps(sessions_[r0_worker], {early}).ok());
  v1::StepReport skipping = Report(r0_worker, job.id(), 0, 4);
  skipping.set_generation(2);
  EXPECT_EQ(ReportSteps(sessions_[r0_worker], {skipping}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Get(job.id()).stage_status(0).step(), 2);
  for (int64_t t = 3; t < 10; ++t) {
    v1::StepReport r0 = Report(r0_worker, job.id(), 0, t);
    r0.set_generation(2);
    ASSERT_TRUE(ReportSteps(sessions_[r0_worker], {r0}).ok());
    v1::StepReport r1 = Report(r1_worker, job.id(), 1, t);
    r1.set_generation(2);
    r1.set_has_loss(true);
    r1.set_loss(100.0 + t);
    ASSERT_TRUE(ReportSteps(sessions_[r1_worker], {r1}).ok());
  }
  EndRank(r0_worker, job.id(), 0, true, "", 2);
  EndRank(r1_worker, job.id(), 1, true, "", 2);
  const v1::Job done = Get(job.id());
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_GT(done.recoveries(0).first_step_unix_ms(), 0);
  // Every step once: 0..2 by generation 1, 3..9 (run again) by generation 2.
  absl::StatusOr<std::vector<StoredStep>> steps = coordinator_->jobs().Steps(job.id(), -1);
  ASSERT_TRUE(steps.ok()) << steps.status();
  ASSERT_EQ(steps->size(), 10u);
  for (int64_t t = 0; t < 10; ++t) {
    SCOPED_TRACE(t);
    EXPECT_EQ((*steps)[t].step, t);
    EXPECT_EQ((*steps)[t].generation, t < 3 ? 1 : 2);
    EXPECT_DOUBLE_EQ((*steps)[t].loss, t < 3 ? 10.0 - t : 100.0 + t);
  }
}

// With too few workers the next generation waits three heartbeat intervals for workers to
// come back, then runs fewer replicas with the same global batch; a job out of restarts
// fails naming the fault and the restarts it had.
TEST_F(CoordinatorCoreTest, ARecoveringJobShrinksAfterTheGraceAndFailsOnceOutOfRestarts) {
  std::vector<std::string> w;
  for (int n = 1; n <= 4; ++n) w.push_back(Register(n));
  v1::JobSpec spec = Spec(2, 2);  // 2 micro-batches per replica
  spec.set_max_restarts(1);
  const v1::Job job = Submit(spec);
  RunLater();
  EndRank(w[3], job.id(), 3, /*ok=*/false, "stage 1 replica 1: CUDA error", 1);
  for (int n = 0; n < 3; ++n) Heartbeat(w[n], job.id(), n);
  clock_->Advance(absl::Seconds(1));
  for (int n = 0; n < 3; ++n) Heartbeat(w[n], job.id(), n);
  coordinator_->Tick();  // the failure is the job's: generation 1 ends
  EXPECT_EQ(Get(job.id()).restarts(), 1);
  RunLater();
  // worker-4 leaves; the others end their stages.
  ASSERT_TRUE(coordinator_->workers()
                  .Deregister(sessions_[w[3]],
                              [&] {
                                v1::DeregisterWorkerRequest r;
                                r.set_worker_id(w[3]);
                                return r;
                              }())
                  .ok());
  for (int n = 0; n < 3; ++n) EndRank(w[n], job.id(), n, false, "stopped", 1);
  RunLater();
  EXPECT_EQ(Get(job.id()).generation(), 1);  // 3 idle of 4: waits for the grace
  clock_->Advance(absl::Milliseconds(3100));
  for (int n = 0; n < 3; ++n) Heartbeat(w[n]);
  coordinator_->Tick();
  RunLater();
  const v1::Job shrunk = Get(job.id());
  EXPECT_EQ(shrunk.generation(), 2);
  EXPECT_EQ(shrunk.stages(), 2);
  EXPECT_EQ(shrunk.replicas(), 1);
  EXPECT_EQ(shrunk.recoveries(0).microbatches(), 4);
  ASSERT_EQ(shrunk.stage_status_size(), 2);
  const v1::StageAssignment& a = Worker(1).assigned.back();
  EXPECT_EQ(a.generation(), 2);
  EXPECT_EQ(a.spec().replicas(), 1);
  EXPECT_EQ(a.spec().microbatches(), 4);
  EXPECT_FALSE(a.spec().has_resume_from());  // no checkpoint yet: from the start
  // Another fault: no restarts left.
  EndRank(shrunk.stage_status(0).worker_id(), job.id(), 0, false, "out of memory", 2);
  EndRank(shrunk.stage_status(1).worker_id(), job.id(), 1, false, "lost stage 0", 2);
  const v1::Job failed = Get(job.id());
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.message(), HasSubstr("out of memory (after 1 restart; max_restarts is 1)"));
}

// The next generation goes only to workers whose memory holds a rank's parameter state; if
// none fits, the job fails once its timeout_s has passed, saying why.
TEST_F(CoordinatorCoreTest, ARecoveringJobUsesOnlyWorkersWithMemoryForARank) {
  auto register_with = [&](int n, int64_t memory) {
    v1::RegisterWorkerRequest r;
    r.set_address("host-" + std::to_string(n) + ":7000");
    r.set_memory_bytes(memory);
    auto response = RegisterAsNewProcess(r);
    EXPECT_TRUE(response.ok()) << response.status();
    sessions_[response->worker_id()] = response->session();
    return response->worker_id();
  };
  const std::string w1 = register_with(1, int64_t{1} << 30), w2 = register_with(2, 1 << 30);
  v1::JobSpec spec = Spec(2);
  spec.set_max_restarts(2);
  spec.set_timeout_s(10);
  const v1::Job job = Submit(spec);
  RunLater();
  const std::string small = register_with(3, 1000), big = register_with(4, int64_t{1} << 30);
  EndRank(w2, job.id(), 1, false, "CUDA error", 1);
  Heartbeat(w1, job.id(), 0);
  clock_->Advance(absl::Seconds(1));
  Heartbeat(w1, job.id(), 0);
  coordinator_->Tick();
  EndRank(w1, job.id(), 0, false, "stopped", 1);
  RunLater();
  // Idle: worker-1, -2, -3 (1000 bytes), -4: the small one is passed over.
  v1::Job second = Get(job.id());
  ASSERT_EQ(second.generation(), 2);
  for (const v1::StageStatus& st : second.stage_status()) EXPECT_NE(st.worker_id(), small);
  // The big workers leave (the first of generation 2 to go ends it: restart 2 of 2); only the
  // small one is left: no layout fits, and the job fails after timeout_s, saying why.
  for (const std::string& w : {big, w1, w2}) {
    v1::DeregisterWorkerRequest leave;
    leave.set_worker_id(w);
    ASSERT_TRUE(coordinator_->workers().Deregister(sessions_[w], leave).ok());
  }
  clock_->Advance(absl::Seconds(11));
  Heartbeat(small);
  coordinator_->Tick();
  const v1::Job failed = Get(job.id());
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.message(), HasSubstr("no workers to restart on within timeout_s"));
  EXPECT_THAT(failed.message(), HasSubstr("bytes for a rank's parameters, gradients and "
                                          "optimizer state, 0 idle have them"));
}

// A skipped step (non-finite loss or gradients) is counted once, from rank 0's report.
TEST_F(CoordinatorCoreTest, SkippedStepsAreCountedOnceAndSaidInTheEvents) {
  const std::string w1 = Register(1), w2 = Register(2);
  const v1::Job job = Submit(Spec(2));
  RunLater();
  for (int64_t t = 0; t < 2; ++t) {
    for (auto [worker, rank] : {std::pair{w1, 0}, std::pair{w2, 1}}) {
      v1::StepReport r = Report(worker, job.id(), rank, t);
      r.set_skipped(t == 1);
      ASSERT_TRUE(ReportSteps(sessions_[worker], {r}).ok());
    }
  }
  EXPECT_EQ(Get(job.id()).skipped_steps(), 1);
  const std::vector<std::string> events = EventTexts(job.id());
  EXPECT_EQ(std::count_if(events.begin(), events.end(),
                          [](const std::string& e) {
                            return e.find(
                                       "step 1 skipped: its loss or gradients were not "
                                       "finite") != std::string::npos;
                          }),
            1);
}

// Skipped steps across a restart: they are counted as they are committed, a step run again
// counts once (and not at all if it is not skipped the second time); the next generation is
// told how many steps right before its first were skipped in a row (toward its
// nonfinite_limit: 7 skipped in a row across restarts once went uncounted); and a job whose
// last steps were skipped ends with its last finite loss, saying so, never a NaN.
TEST_F(CoordinatorCoreTest, SkippedStepsCountOnceAcrossARestartAndTheNextGenerationKnowsTheStreak) {
  const RecoverableJob started = StartRecoverableJob(10);
  const std::string &w1 = started.w1, &w2 = started.w2, &w3 = started.w3;
  const v1::Job& job = started.job;
  EXPECT_EQ(Worker(1).assigned[0].skipped_in_a_row(), 0);
  // Generation 1: steps 1, 2 and 4 skipped; the checkpoint before step 3 committed.
  const auto report = [&](const std::string& worker, int rank, int64_t t, bool skipped,
                          int generation) {
    v1::StepReport r = Report(worker, job.id(), rank, t);
    r.set_generation(generation);
    r.set_skipped(skipped);
    if (rank == 1) {
      r.set_has_loss(true);
      r.set_loss(skipped ? std::nan("") : 10.0 - t);
    }
    if (rank == 0 && t == 2 && generation == 1) r.set_checkpoint_committed("/ckpt/step-00000003");
    ASSERT_TRUE(ReportSteps(sessions_[worker], {r}).ok());
  };
  for (int64_t t = 0; t < 5; ++t) {
    const bool skipped = t == 1 || t == 2 || t == 4;
    report(w1, 0, t, skipped, 1);
    report(w2, 1, t, skipped, 1);
  }
  EXPECT_EQ(Get(job.id()).skipped_steps(), 3);
  EXPECT_EQ(Get(job.id()).loss(), 10.0 - 3) << "the last finite loss";
  // worker-2 goes silent; generation 2 resumes from the checkpoint before step 3.
  SilenceWorkerTwo(started);
  RunLater();
  EndRank(w1, job.id(), 0, /*ok=*/false, "stopped", /*generation=*/1);
  PassSeconds(2, {w1, w3});
  ASSERT_EQ(Worker(3).assigned.size(), 1u);
  // Steps 1 and 2, right before step 3, were skipped in a row.
  EXPECT_EQ(Worker(3).assigned[0].skipped_in_a_row(), 2);
  EXPECT_EQ(Worker(1).assigned.back().skipped_in_a_row(), 2);
  const std::string r0_worker = Worker(1).assigned.back().rank() == 0 ? w1 : w3;
  const std::string r1_worker = r0_worker == w1 ? w3 : w1;
  // Generation 2: step 4 is not skipped this time, steps 8 and 9 are.
  for (int64_t t = 3; t < 10; ++t) {
    const bool skipped = t >= 8;
    report(r0_worker, 0, t, skipped, 2);
    report(r1_worker, 1, t, skipped, 2);
  }
  EndRank(r0_worker, job.id(), 0, true, "", 2);
  EndRank(r1_worker, job.id(), 1, true, "", 2);
  const v1::Job done = Get(job.id());
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.skipped_steps(), 4) << "steps 1, 2, 8 and 9";
  EXPECT_EQ(done.loss(), 10.0 - 7);
  const std::vector<std::string> events = EventTexts(job.id());
  EXPECT_THAT(events, Contains(HasSubstr("succeeded: 10 steps, final loss 3.0000 (step 7's: the "
                                         "last 2 skipped, their loss or gradients not finite)")));
  for (int t : {1, 2, 4, 8, 9}) {
    EXPECT_EQ(std::count_if(events.begin(), events.end(),
                            [t](const std::string& e) {
                              return e.rfind("step " + std::to_string(t) + " skipped", 0) == 0;
                            }),
              1)
        << t;
  }
}

// The final checkpoint (after the last step) is said in the events but is no restart point:
// a rank failing while the job ends restarts it from the policy's last checkpoint (a
// generation resumed after the last step would have nothing to run).
TEST_F(CoordinatorCoreTest, TheFinalCheckpointIsNoRestartPoint) {
  const std::string w1 = Register(1), w2 = Register(2), w3 = Register(3);
  v1::JobSpec spec = Spec(2);
  spec.set_steps(4);
  spec.set_max_restarts(1);
  const v1::Job job = Submit(spec);
  RunLater();
  for (int64_t t = 0; t < 4; ++t) {
    v1::StepReport r0 = Report(w1, job.id(), 0, t);
    if (t == 1) r0.set_checkpoint_committed("/ckpt/step-00000002");
    if (t == 3) r0.set_checkpoint_committed("/ckpt/step-00000004");
    ASSERT_TRUE(ReportSteps(sessions_[w1], {r0}).ok());
    ASSERT_TRUE(ReportSteps(sessions_[w2], {Report(w2, job.id(), 1, t)}).ok());
  }
  EXPECT_EQ(Get(job.id()).step(), 3);
  EXPECT_EQ(Get(job.id()).checkpoint_step(), 2);
  EXPECT_EQ(Get(job.id()).checkpoint_path(), "/ckpt/step-00000002");
  const std::vector<std::string> events = EventTexts(job.id());
  EXPECT_NE(std::find(events.begin(), events.end(),
                      "final checkpoint (after step 3) committed: /ckpt/step-00000004"),
            events.end());
  // Rank 1 fails while the job ends: generation 2 resumes before step 2.
  EndRank(w1, job.id(), 0, /*ok=*/true, "");
  EndRank(w2, job.id(), 1, /*ok=*/false, "lost its connection while leaving");
  clock_->Advance(absl::Seconds(2));
  Heartbeat(w1);
  Heartbeat(w3);
  coordinator_->Tick();
  const v1::Job recovering = Get(job.id());
  ASSERT_EQ(recovering.recoveries_size(), 1) << recovering.DebugString();
  EXPECT_EQ(recovering.recoveries(0).resumed_at_step(), 2);
}

// A coordinator that restarts resumes a running job that has restarts left.
TEST_F(CoordinatorCoreTest, ARestartResumesARunningJobWithRestartsLeft) {
  const std::string w1 = Register(1);
  v1::JobSpec spec = Spec(1);
  spec.set_max_restarts(3);
  const v1::Job running = Submit(spec);
  RunLater();
  coordinator_.reset();
  Open();
  v1::Job recovering = Get(running.id());
  EXPECT_EQ(recovering.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(recovering.restarts(), 1);
  EXPECT_THAT(recovering.message(), HasSubstr("the coordinator restarted"));
  // Its worker registers again; after the grace the job runs as generation 2 on it.
  const std::string again = Register(1);
  clock_->Advance(absl::Milliseconds(3100));
  Heartbeat(again);
  coordinator_->Tick();
  RunLater();
  const v1::Job resumed = Get(running.id());
  EXPECT_EQ(resumed.generation(), 2);
  EXPECT_EQ(resumed.stage_status(0).worker_id(), again);
}

TEST_F(CoordinatorCoreTest, ASubmissionWhoseWriteFailsIsRefusedAndLeavesNothing) {
  Register(1);
  data_->fail_puts = true;
  auto refused = coordinator_->jobs().Submit(Spec(1));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("disk I/O error"));
  EXPECT_EQ(coordinator_->jobs().List()->jobs_size(), 0);
  RunLater();
  EXPECT_TRUE(Worker(1).assigned.empty());  // never placed
  EXPECT_TRUE(data_->events.empty());
  data_->fail_puts = false;
  const v1::Job accepted = Submit(Spec(1));
  EXPECT_EQ(accepted.state(), v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(data_->jobs.count(accepted.id()));
}

TEST_F(CoordinatorCoreTest, AProgressWriteThatFailsIsWrittenByTheNextFlush) {
  const std::string w1 = Register(1);
  const v1::Job job = Submit(Spec(1));
  RunLater();
  data_->fail_puts = true;
  EndRank(w1, job.id(), 0);  // SUCCEEDED in memory, its write fails
  data_->fail_puts = false;
  coordinator_->Tick();  // any later flush writes it
  v1::Job stored;
  ASSERT_TRUE(stored.ParseFromString(data_->jobs.at(job.id()).job));
  EXPECT_EQ(stored.state(), v1::JOB_STATE_SUCCEEDED);
}

}  // namespace
}  // namespace pipetrain::coordinator::core_test
