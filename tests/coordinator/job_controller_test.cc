// A job's controller alone, event in, effects out: no coordinator, no sockets, no sleeps (a
// fake clock). Each protocol it carries: a generation placed, steps committed once every rank
// finished them, step commands taking effect, a checkpoint becoming the restart point, a
// drain restarting the job from its checkpoint, a lost rank's survivors going on from their
// newest common step with their state held, the job's end, and a record found after a
// coordinator restart. The parts it is made of have their own tables (job_machine_test,
// step_ledger_test, restart_point_test, survivor_round_test, survivor_hold_test); these
// check that the controller joins them as the coordinator relies on.
#include "coordinator/job_controller.h"

#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace pipetrain::coordinator {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using Store = JobEffects::Store;
using Write = JobEffects::Write;

constexpr int kStages = 2;
constexpr int kReplicas = 2;
constexpr int kRanks = kStages * kReplicas;
constexpr int kSteps = 20;

std::string WorkerOf(int rank) { return "worker-" + std::to_string(rank); }

// Worker ids of the stops, in order.
std::vector<std::string> Stopped(const JobEffects& effects) {
  std::vector<std::string> ids;
  for (const JobEffects::Stop& stop : effects.stops) ids.push_back(stop.worker_id);
  return ids;
}

class JobControllerTest : public ::testing::Test {
 protected:
  // A queued 2 x 2 job of kSteps steps with `max_restarts`, its record as Submit makes it.
  JobController Queued(int max_restarts) {
    v1::Job job;
    job.set_id("job-0001");
    job.set_state(v1::JOB_STATE_QUEUED);
    job.set_stages(kStages);
    job.set_replicas(kReplicas);
    job.set_steps(kSteps);
    job.set_step(-1);
    job.set_data_unit("tok");
    job::JobSpec config;
    config.set_stages(kStages);
    config.set_replicas(kReplicas);
    config.set_steps(kSteps);
    config.set_max_restarts(max_restarts);
    return JobController({clock_, absl::Seconds(1)}, job, config);
  }

  // Its first generation placed, rank r on worker-r; the placement's effects taken.
  JobController Running(int max_restarts) {
    JobController c = Queued(max_restarts);
    Start(c, 0);
    (void)c.TakeEffects();
    return c;
  }

  // Its next generation placed on `workers` (worker-r for rank r if none given).
  void Start(JobController& c, int64_t start_step, std::vector<std::string> workers = {}) {
    for (int r = static_cast<int>(workers.size()); r < kRanks; ++r) workers.push_back(WorkerOf(r));
    c.StartGeneration(
        workers, [](const std::string&) { return std::string("host-a"); }, v1::JobSpec(),
        start_step, LiveAddress());
  }

  // A worker's address while it is not in `lost_`.
  std::function<std::string(const std::string&)> LiveAddress() {
    return [this](const std::string& id) {
      return lost_.count(id) > 0 ? std::string() : id + ":7000";
    };
  }

  // Rank `rank`'s report of `step`: a last stage says its replica's loss, 1 + replica.
  v1::StepReport Report(const JobController& c, int rank, int64_t step) {
    v1::StepReport r;
    r.set_job_id("job-0001");
    r.set_worker_id(WorkerOf(rank));
    r.set_rank(rank);
    r.set_step(step);
    r.set_generation(static_cast<int32_t>(c.job().generation()));
    r.set_compute_s(0.1 * (step + 1));
    r.set_end_s(0.2 * (step + 1));
    if (rank % kStages == kStages - 1) {
      r.set_has_loss(true);
      r.set_loss(1.0 + rank / kStages);
    }
    return r;
  }

  // Every rank reports every step in [from, to]; the effects of all of it.
  JobEffects Steps(JobController& c, int64_t from, int64_t to) {
    for (int64_t step = from; step <= to; ++step) {
      for (int r = 0; r < kRanks; ++r) c.ReportStep(Report(c, r, step));
    }
    return c.TakeEffects();
  }

  std::shared_ptr<FakeClock> clock_ = std::make_shared<FakeClock>();
  std::set<std::string> lost_;
};

TEST_F(JobControllerTest, AGenerationPlacedOpensItsStoreNamesItsRanksAndIsWrittenAtOnce) {
  JobController c = Queued(/*max_restarts=*/0);
  EXPECT_THAT(c.TakeEffects().events, IsEmpty());  // nothing asked before any event
  Start(c, 0);
  const JobEffects placed = c.TakeEffects();
  EXPECT_EQ(placed.rendezvous, Store::kOpen);
  EXPECT_EQ(placed.write, Write::kNow);
  EXPECT_THAT(placed.events,
              ElementsAre("running: stage 0 replica 0 on worker-0, stage 1 replica 0 on "
                          "worker-1, stage 0 replica 1 on worker-2, stage 1 replica 1 on "
                          "worker-3"));
  EXPECT_EQ(c.phase(), Phase::kRunning);
  EXPECT_EQ(c.job().generation(), 1);
  EXPECT_THAT(c.rank_worker(), ElementsAre("worker-0", "worker-1", "worker-2", "worker-3"));
  const v1::StageAssignment assignment = c.AssignmentFor(3);
  EXPECT_EQ(assignment.rank(), 3);
  EXPECT_EQ(assignment.generation(), 1);
  EXPECT_FALSE(assignment.commit_steps());  // no restarts: the survivors could not go on
  EXPECT_TRUE(Running(/*max_restarts=*/1).AssignmentFor(0).commit_steps());
  EXPECT_THAT(c.TakeEffects().events, IsEmpty());  // taken once
}

TEST_F(JobControllerTest, AStepIsCommittedOnceEveryRankFinishedItWithItsReplicasMeanLoss) {
  JobController c = Running(0);
  for (int r = 0; r + 1 < kRanks; ++r) c.ReportStep(Report(c, r, 0));
  const JobEffects partial = c.TakeEffects();
  EXPECT_THAT(partial.steps, IsEmpty());  // rank 3 has not finished step 0
  EXPECT_EQ(partial.write, Write::kProgress);
  EXPECT_EQ(c.job().step(), -1);

  c.ReportStep(Report(c, 3, 0));
  const JobEffects committed = c.TakeEffects();
  ASSERT_EQ(committed.steps.size(), 1u);
  EXPECT_EQ(committed.steps[0].step, 0);
  EXPECT_EQ(committed.steps[0].generation, 1);
  ASSERT_TRUE(committed.steps[0].has_loss);
  EXPECT_EQ(committed.steps[0].loss, (1.0 + 2.0) / 2);  // replicas' losses 1 and 2
  EXPECT_EQ(committed.write, Write::kProgress);         // progress: at most once a second
  EXPECT_EQ(c.job().step(), 0);
  EXPECT_EQ(c.job().loss(), 1.5);
}

TEST_F(JobControllerTest, StepCommandsTookEffectOnceEveryRankReportedThemPerBoundary) {
  JobController c = Running(0);
  Steps(c, 0, 2);
  for (int r = 0; r < kRanks; ++r) {
    v1::StepReport report = Report(c, r, 3);
    report.add_commands_after(v1::STEP_COMMAND_FLUSH);
    c.ReportStep(report);
    const JobEffects effects = c.TakeEffects();
    const auto took = Contains(HasSubstr("took effect before step 4 on all 4 ranks"));
    if (r + 1 < kRanks) {
      EXPECT_THAT(effects.events, Not(took)) << "after rank " << r;
    } else {
      EXPECT_THAT(effects.events, took);
    }
  }
  // The next boundary counts afresh: three ranks are not all.
  for (int r = 0; r + 1 < kRanks; ++r) {
    v1::StepReport report = Report(c, r, 4);
    report.add_commands_after(v1::STEP_COMMAND_FLUSH);
    c.ReportStep(report);
  }
  EXPECT_THAT(c.TakeEffects().events, Not(Contains(HasSubstr("took effect"))));
}

TEST_F(JobControllerTest, ACheckpointIsTheRestartPointOnceEveryStepBeforeItIsCommitted) {
  JobController c = Running(0);
  Steps(c, 0, 3);
  v1::StepReport committing = Report(c, 0, 4);
  committing.set_checkpoint_committed("ckpt/step-00000005");
  c.ReportStep(committing);
  const JobEffects reported = c.TakeEffects();
  EXPECT_EQ(reported.write, Write::kProgress);  // step 4 is not every rank's yet
  EXPECT_THAT(reported.events, Not(Contains(HasSubstr("committed"))));
  EXPECT_EQ(c.job().checkpoint_step(), 0);

  for (int r = 1; r < kRanks; ++r) c.ReportStep(Report(c, r, 4));
  const JobEffects moved = c.TakeEffects();
  EXPECT_EQ(moved.write, Write::kNow);  // with the rows of the steps before it
  EXPECT_THAT(moved.events, Contains("checkpoint before step 5 committed: ckpt/step-00000005"));
  ASSERT_EQ(moved.steps.size(), 1u);
  EXPECT_EQ(c.job().checkpoint_step(), 5);
  EXPECT_EQ(c.job().checkpoint_path(), "ckpt/step-00000005");
}

TEST_F(JobControllerTest, ADrainedWorkersCheckpointRestartsTheJobFromItWithoutTheWorker) {
  JobController c = Running(/*max_restarts=*/2);
  Steps(c, 0, 1);
  c.Drain("worker-3", "10.0.0.4:7000", 5);
  const JobEffects drained = c.TakeEffects();
  EXPECT_THAT(drained.events, ElementsAre(HasSubstr("worker-3 is stopping (drained): "
                                                    "checkpoint scheduled before step 5")));
  EXPECT_EQ(drained.write, Write::kNow);
  EXPECT_EQ(c.drain_step(), 5);

  Steps(c, 2, 3);
  v1::StepReport committing = Report(c, 0, 4);
  committing.set_checkpoint_committed("ckpt/step-00000005");
  c.ReportStep(committing);
  for (int r = 1; r < kRanks; ++r) c.ReportStep(Report(c, r, 4));
  const JobEffects restarted = c.TakeEffects();
  EXPECT_EQ(c.phase(), Phase::kRecovering);
  EXPECT_EQ(c.job().checkpoint_step(), 5);
  EXPECT_EQ(c.job().restarts(), 1);
  // Every rank is stopped; nobody's state is held (the checkpoint is where it goes on).
  EXPECT_THAT(Stopped(restarted), ElementsAre("worker-0", "worker-1", "worker-2", "worker-3"));
  EXPECT_EQ(restarted.rendezvous, Store::kClose);
  EXPECT_FALSE(restarted.began_holding);
  EXPECT_THAT(restarted.events,
              Contains(AllOf(HasSubstr("generation 1 ended"), HasSubstr("10.0.0.4:7000"),
                             HasSubstr("from the checkpoint before step 5 (0 steps to run "
                                       "again)"))));
  EXPECT_EQ(c.job().step(), 4);
}

TEST_F(JobControllerTest, ALostRanksSurvivorsGoOnFromTheirNewestCommonStepWithTheirStateHeld) {
  JobController c = Running(/*max_restarts=*/2);
  Steps(c, 0, 2);
  lost_.insert("worker-3");
  c.WorkerLost(3, /*generation=*/1, absl::Seconds(2), "worker-3 (10.0.0.4:7000)",
               "stopped sending heartbeats", absl::Seconds(3));
  const JobEffects ended = c.TakeEffects();
  EXPECT_EQ(c.phase(), Phase::kRecovering);
  // The store stays for the survivors' round; the ranks still running are stopped.
  EXPECT_EQ(ended.rendezvous, Store::kUnchanged);
  EXPECT_THAT(Stopped(ended), ElementsAre("worker-0", "worker-1", "worker-2"));
  EXPECT_THAT(ended.events,
              Contains(AllOf(HasSubstr("generation 1 ended: worker-3 (10.0.0.4:7000) running "
                                       "stage 1 replica 1 stopped sending heartbeats"),
                             HasSubstr("from the survivors' newest common step"))));
  // The next generation waits for the lost worker's lease (3 s from its last heartbeat, 2 s
  // ago) and an interval.
  EXPECT_EQ(c.lost_ranks_stop_by(), clock_->Now() + absl::Seconds(2));

  // The survivors say where they stand, each at step 3; each waits until every rank is
  // accounted for.
  auto stopped = [&](int rank, int64_t next_step) {
    v1::StoppedRank s;
    s.set_job_id("job-0001");
    s.set_worker_id(WorkerOf(rank));
    s.set_rank(rank);
    s.set_generation(1);
    s.set_next_step(next_step);
    s.set_held_step(-1);
    s.add_layers(rank % kStages);
    return c.Stopped(s);
  };
  absl::StatusOr<v1::SurvivorInstruction> first = stopped(0, 3);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->action(), v1::SurvivorInstruction::WAIT);
  EXPECT_GT(first->wait_ms(), 0);
  ASSERT_TRUE(stopped(1, 3).ok());
  EXPECT_THAT(c.TakeEffects().events, IsEmpty());
  absl::StatusOr<v1::SurvivorInstruction> last = stopped(2, 3);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->action(), v1::SurvivorInstruction::GO_ON);
  EXPECT_EQ(last->step(), 3);
  const JobEffects decided = c.TakeEffects();
  EXPECT_EQ(decided.rendezvous, Store::kOpen);  // a store of their own for their writes
  EXPECT_TRUE(decided.began_holding);
  EXPECT_THAT(decided.events, Contains(HasSubstr("the survivors' plan: go on from step 3")));
  ASSERT_TRUE(c.held_state().has_value());
  EXPECT_EQ(c.held_state()->step, 3);
  EXPECT_TRUE(c.held_state()->HeldBy("worker-1"));
  EXPECT_FALSE(c.held_state()->HeldBy("worker-3"));
  EXPECT_TRUE(c.KeepsHeldState());

  // A survivor commits their state as the checkpoint before step 3: the restart point.
  v1::StageEnd written;
  written.set_job_id("job-0001");
  written.set_worker_id("worker-1");
  written.set_rank(1);
  written.set_generation(1);
  written.set_ok(false);
  written.set_survivor_checkpoint("ckpt/step-00000003");
  written.set_survivor_step(3);
  c.StageEnd(written);
  const JobEffects committed = c.TakeEffects();
  EXPECT_THAT(committed.events,
              Contains(HasSubstr("the survivors' state before step 3 committed: "
                                 "ckpt/step-00000003: the survivors go on from step 3 (no "
                                 "step to run again)")));
  EXPECT_EQ(c.job().checkpoint_step(), 3);
  EXPECT_EQ(c.lost_ranks_stop_by(), absl::InfinitePast());  // no lease to wait for now
  EXPECT_TRUE(c.job().recoveries(0).from_survivors());

  // The next generation at step 3, on the survivors and a spare, takes their state from the
  // workers holding it, never the lost one.
  Start(c, 3, {"worker-0", "worker-1", "worker-2", "worker-4"});
  const JobEffects next = c.TakeEffects();
  EXPECT_EQ(c.job().generation(), 2);
  EXPECT_THAT(next.events, Contains(HasSubstr("the ranks take the survivors' state at step 3 "
                                              "from the")));
  const v1::ReplicaState state = c.AssignmentFor(3).replica_state();
  ASSERT_GT(state.layers_size(), 0);
  for (const auto& layer : state.layers()) {
    EXPECT_THAT(layer.addresses(), Not(Contains("worker-3:7000")));
  }
  EXPECT_TRUE(c.KeepsHeldState());  // until step 3 is committed again
  Steps(c, 3, 3);
  EXPECT_FALSE(c.KeepsHeldState());
  EXPECT_FALSE(c.held_state().has_value());
}

TEST_F(JobControllerTest, AJobWithoutTheCommitAnswersItsStoppedRanksAbandon) {
  JobController c = Running(/*max_restarts=*/0);
  v1::StoppedRank s;
  s.set_job_id("job-0001");
  s.set_rank(0);
  s.set_generation(1);
  absl::StatusOr<v1::SurvivorInstruction> answer = c.Stopped(s);
  ASSERT_TRUE(answer.ok());
  EXPECT_EQ(answer->action(), v1::SurvivorInstruction::ABANDON);
  EXPECT_THAT(answer->reason(), HasSubstr("does not commit its steps"));
  // A report that cannot be is refused, and changes nothing.
  JobController with = Running(/*max_restarts=*/1);
  s.set_next_step(-2);
  EXPECT_EQ(with.Stopped(s).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(with.phase(), Phase::kRunning);
}

TEST_F(JobControllerTest, EveryRankEndingWellEndsTheJobAndClosesItsStore) {
  JobController c = Running(0);
  Steps(c, 0, kSteps - 1);
  for (int r = 0; r < kRanks; ++r) {
    v1::StageEnd end;
    end.set_job_id("job-0001");
    end.set_worker_id(WorkerOf(r));
    end.set_rank(r);
    end.set_generation(1);
    end.set_ok(true);
    c.StageEnd(end);
    if (r + 1 < kRanks) EXPECT_EQ(c.TakeEffects().rendezvous, Store::kUnchanged);
  }
  const JobEffects ended = c.TakeEffects();
  EXPECT_EQ(c.phase(), Phase::kSucceeded);
  EXPECT_EQ(c.job().state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(ended.rendezvous, Store::kClose);
  EXPECT_EQ(ended.write, Write::kNow);
  EXPECT_THAT(ended.events, Contains(HasSubstr("succeeded: 20 steps, final loss 1.5000")));
  EXPECT_THAT(Stopped(ended), IsEmpty());
}

TEST_F(JobControllerTest, AJobFoundRunningAfterARestartRecoversOrIsMarkedInterrupted) {
  v1::Job record = Running(0).job();
  record.set_step(6);
  job::JobSpec config;
  config.set_steps(kSteps);
  config.set_max_restarts(1);
  JobController restartable = JobController::FromRecord({clock_, absl::Seconds(1)}, record, config);
  const JobEffects recovering = restartable.TakeEffects();
  EXPECT_EQ(restartable.phase(), Phase::kRecovering);
  EXPECT_THAT(recovering.events,
              Contains(HasSubstr("generation 1 ended: the coordinator restarted (7 of 20 "
                                 "steps recorded)")));
  EXPECT_EQ(recovering.write, Write::kNow);

  config.set_max_restarts(0);
  JobController ended = JobController::FromRecord({clock_, absl::Seconds(1)}, record, config);
  EXPECT_EQ(ended.phase(), Phase::kFailed);
  EXPECT_THAT(ended.job().message(), HasSubstr("interrupted by a coordinator restart (7 of 20"));
  EXPECT_THAT(ended.TakeEffects().events, ElementsAre(ended.job().message()));
  // A spec this version no longer reads cannot restart either.
  JobController unreadable = JobController::FromRecord({clock_, absl::Seconds(1)}, record,
                                                       absl::InvalidArgumentError("unknown field"));
  EXPECT_EQ(unreadable.phase(), Phase::kFailed);
}

}  // namespace
}  // namespace pipetrain::coordinator
