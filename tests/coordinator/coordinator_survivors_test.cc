// The survivors of a fault (job_controller.h, report_manager.h) without processes, sockets or
// sleeps (coordinator_fixture.h): a generation with the step commit whose rank is lost goes on from
// its survivors' newest common step, every step before it committed once; survivors that
// cannot agree (negative control), a write that fails, a rank that never reports, and a job
// that cannot keep survivors leave the restart point at the last checkpoint. The daemon test
// (tests/daemons/survivors_test.cc) runs the same end to end with real ranks.
#include "tests/coordinator/coordinator_fixture.h"

namespace pipetrain::coordinator::core_test {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

class SurvivorsTest : public CoordinatorCoreTest {
 protected:
  // 2 stages x 2 replicas on workers 1..4 (rank r on worker r + 1), a spare worker 5, one
  // restart; every rank reports steps 0..4 (the last stages with their losses) and rank 0
  // committed the checkpoint before step 3.
  void StartJob(const std::string& schedule = "1f1b", int max_restarts = 1) {
    for (int n = 1; n <= 5; ++n) w_.push_back(Register(n));
    v1::JobSpec spec = Spec(2, 2);
    spec.set_schedule(schedule);
    spec.set_steps(10);
    spec.set_max_restarts(max_restarts);
    job_ = Submit(spec).id();
    RunLater();
    for (int r = 0; r < 4; ++r) {
      ASSERT_EQ(Worker(r + 1).assigned.size(), 1u);
      ASSERT_EQ(Worker(r + 1).assigned[0].rank(), r);
    }
    for (int64_t t = 0; t < 5; ++t) {
      for (int r = 0; r < 4; ++r) {
        v1::StepReport report = Report(w_[r], job_, r, t);
        if (r % 2 == 1) {
          report.set_has_loss(true);
          report.set_loss(10.0 - t + r);
        }
        if (r == 0 && t == 2) report.set_checkpoint_committed("/ckpt/step-00000003");
        ASSERT_TRUE(ReportSteps(sessions_[w_[r]], {report}).ok());
      }
    }
    ASSERT_EQ(Get(job_).step(), 4);
    ASSERT_EQ(Get(job_).checkpoint_step(), 3);
  }

  v1::SurvivorInstruction Stopped(int rank, int64_t next_step, int64_t held_step,
                                  std::optional<double> held_loss = std::nullopt,
                                  std::vector<int> layers = {}) {
    v1::StoppedRank s;
    for (int layer : layers) s.add_layers(layer);
    s.set_worker_id(w_[rank]);
    s.set_job_id(job_);
    s.set_rank(rank);
    s.set_generation(1);
    s.set_next_step(next_step);
    s.set_held_step(held_step);
    if (held_loss) {
      s.set_has_held_loss(true);
      s.set_held_loss(*held_loss);
    }
    s.set_error("lost stage 1");
    s.set_failed_after_peer(true);
    absl::StatusOr<v1::SurvivorInstruction> answer =
        coordinator_->reports().ReportStopped(sessions_[w_[rank]], s);
    EXPECT_TRUE(answer.ok()) << answer.status();
    return answer.ok() ? *answer : v1::SurvivorInstruction();
  }

  // Worker 4 (rank 3) goes silent; the others heartbeat: it is lost 2 s later.
  void LoseRankThree() {
    clock_->Advance(absl::Milliseconds(1500));
    for (int r : {0, 1, 2}) Heartbeat(w_[r], job_, r);
    Heartbeat(w_[4]);
    clock_->Advance(absl::Milliseconds(600));
    coordinator_->Tick();
  }

  void End(int rank, const std::string& checkpoint = "", int64_t step = -1,
           const std::string& failed = "") {
    v1::StageEnd end;
    end.set_worker_id(w_[rank]);
    end.set_job_id(job_);
    end.set_rank(rank);
    end.set_generation(1);
    end.set_ok(false);
    end.set_error("lost stage 1");
    end.set_survivor_checkpoint(checkpoint);
    end.set_survivor_step(step);
    end.set_survivor_failed(failed);
    EXPECT_TRUE(coordinator_->reports().ReportStageEnd(sessions_[w_[rank]], end).ok());
  }

  // Past the lost worker's lease: generation 2 is placed on the idle workers.
  void PastTheLease() {
    for (int beat = 0; beat < 3; ++beat) {
      clock_->Advance(absl::Milliseconds(1000));
      for (int n : {0, 1, 2, 4}) Heartbeat(w_[n]);
      coordinator_->Tick();
      RunLater();
    }
  }

  // The generation-2 assignments made so far.
  std::vector<v1::StageAssignment> Generation2() {
    std::vector<v1::StageAssignment> out;
    for (int n = 1; n <= 5; ++n) {
      for (const v1::StageAssignment& a : Worker(n).assigned) {
        if (a.generation() == 2) out.push_back(a);
      }
    }
    return out;
  }

  std::vector<std::string> w_;
  std::string job_;
};

// Rank 3 lost during step 5: ranks 0..2 hold step 5's final gradient (their commit began and
// did not end), so every place can stand at step 6. The first report stops the other ranks;
// the job goes on from step 6: ranks 0 and 1 (replica 0) write their state, rank 2 only
// applies its update; steps 0..5 are committed (step 5 with the loss rank 1 held), and
// generation 2 resumes from the survivors' checkpoint at once (no lease to wait for).
TEST_F(SurvivorsTest, ALostRankCostsNoStepWhenEveryPlaceHasASurvivor) {
  StartJob();
  EXPECT_TRUE(Worker(1).assigned[0].commit_steps());
  EXPECT_EQ(Stopped(0, 5, 5).action(), v1::SurvivorInstruction::WAIT);
  // The generation is over: the ranks still running are told to stop at once, to report too.
  RunLater();
  for (int n : {2, 3, 4}) {
    ASSERT_EQ(Worker(n).stopped.size(), 1u) << n;
    EXPECT_EQ(Worker(n).stopped[0].generation(), 1);
    EXPECT_THAT(Worker(n).stopped[0].reason(), HasSubstr("the survivors report"));
  }
  LoseRankThree();
  ASSERT_EQ(Get(job_).restarts(), 1);
  EXPECT_THAT(EventTexts(job_),
              Contains(HasSubstr("from the survivors' newest common step, or else from the "
                                 "checkpoint before step 3")));
  const v1::SurvivorInstruction waiting = Stopped(1, 5, 5, 7.25);
  EXPECT_EQ(waiting.action(), v1::SurvivorInstruction::WAIT);
  EXPECT_GT(waiting.wait_ms(), 0);
  const v1::SurvivorInstruction two = Stopped(2, 5, 5);
  ASSERT_EQ(two.action(), v1::SurvivorInstruction::GO_ON);
  EXPECT_EQ(two.step(), 6);
  EXPECT_TRUE(two.apply_held_update());
  EXPECT_FALSE(two.write_state());
  for (int rank : {0, 1}) {
    const v1::SurvivorInstruction go = Stopped(rank, 5, 5);
    ASSERT_EQ(go.action(), v1::SurvivorInstruction::GO_ON) << rank;
    EXPECT_EQ(go.step(), 6);
    EXPECT_TRUE(go.apply_held_update());
    EXPECT_TRUE(go.write_state());
  }
  // An intention, until their state is committed.
  EXPECT_THAT(EventTexts(job_),
              Contains(HasSubstr("the survivors' plan: go on from step 6 once 2 of them wrote "
                                 "their stage's state (3 apply their held update first)")));
  EXPECT_THAT(EventTexts(job_), Not(Contains(HasSubstr("the survivors go on from step 6"))));
  End(2);
  End(0);
  End(1, "/ckpt/step-00000006", 6);
  const v1::Job job = Get(job_);
  EXPECT_EQ(job.step(), 5);
  EXPECT_EQ(job.checkpoint_step(), 6);
  EXPECT_EQ(job.checkpoint_path(), "/ckpt/step-00000006");
  ASSERT_EQ(job.recoveries_size(), 1);
  EXPECT_TRUE(job.recoveries(0).from_survivors());
  EXPECT_EQ(job.recoveries(0).resumed_at_step(), 6);
  EXPECT_EQ(job.recoveries(0).failed_after_step(), 4);
  EXPECT_THAT(EventTexts(job_), Contains(HasSubstr("the survivors go on from step 6 (no step "
                                                   "to run again)")));
  // Placed at once, without waiting for the lost worker's lease (it has no peer left).
  RunLater();
  const std::vector<v1::StageAssignment> next = Generation2();
  ASSERT_EQ(next.size(), 4u);
  for (const v1::StageAssignment& a : next) {
    EXPECT_EQ(a.spec().resume_from(), "/ckpt/step-00000006");
    EXPECT_FALSE(a.commit_steps()) << "no restart left: no survivors to keep";
  }
  const auto& rows = data_->steps.at(job_);
  ASSERT_EQ(rows.size(), 6u);
  for (int64_t t = 0; t < 6; ++t) ASSERT_EQ(rows.count(t), 1u) << t;
  ASSERT_TRUE(rows.at(5).has_loss);
  EXPECT_EQ(rows.at(5).loss, 7.25);
  EXPECT_EQ(rows.at(4).loss, (7.0 + 9.0) / 2);
}

// The survivors hold their layers in memory for the next generation: each survivor standing
// at step 6 is told to hold them under one key; generation 2's assignments name, for every
// layer, the workers holding it (not the lost one), so its ranks read no checkpoint; a
// heartbeat's answer tells a holder to keep holding until the job has committed step 6 again,
// and never names the job to a worker that holds nothing.
TEST_F(SurvivorsTest, TheNextGenerationTakesTheSurvivorsStateFromTheWorkersHoldingIt) {
  StartJob();
  // Stage 0 holds layers 0-1, stage 1 layers 2-3.
  const auto layers_of = [](int rank) {
    return rank % 2 == 0 ? std::vector<int>{0, 1} : std::vector<int>{2, 3};
  };
  Stopped(0, 5, 5, std::nullopt, layers_of(0));
  LoseRankThree();
  Stopped(1, 5, 5, 7.25, layers_of(1));
  Stopped(2, 5, 5, std::nullopt, layers_of(2));
  std::string key;
  for (int rank : {0, 1, 2}) {
    const v1::SurvivorInstruction go = Stopped(rank, 5, 5, std::nullopt, layers_of(rank));
    ASSERT_EQ(go.action(), v1::SurvivorInstruction::GO_ON) << rank;
    EXPECT_TRUE(go.hold_state()) << rank;
    EXPECT_EQ(go.state_key().size(), 32u);
    EXPECT_GT(go.hold_ms(), 0);
    if (key.empty()) key = go.state_key();
    EXPECT_EQ(go.state_key(), key) << "one key for the round";
  }
  const auto held_jobs = [&](int worker) {
    v1::HeartbeatRequest h;
    h.set_worker_id(w_[worker]);
    v1::HeartbeatResponse response;
    EXPECT_TRUE(coordinator_->workers().Heartbeat(sessions_[w_[worker]], h, &response).ok());
    return std::vector<std::string>(response.held_state_jobs().begin(),
                                    response.held_state_jobs().end());
  };
  EXPECT_THAT(held_jobs(0), ::testing::ElementsAre(job_));
  EXPECT_TRUE(held_jobs(4).empty()) << "the spare holds nothing";
  End(2);
  End(0);
  End(1, "/ckpt/step-00000006", 6);
  RunLater();
  int assigned = 0;
  for (int n = 1; n <= 5; ++n) {
    for (const v1::StageAssignment& a : Worker(n).assigned) {
      if (a.generation() != 2) continue;
      ++assigned;
      const v1::ReplicaState& state = a.replica_state();
      EXPECT_EQ(state.step(), 6);
      EXPECT_EQ(state.state_key(), key);
      ASSERT_EQ(state.layers_size(), 4) << state.DebugString();
      for (const auto& layer : state.layers()) {
        const std::vector<std::string> holders(layer.addresses().begin(), layer.addresses().end());
        if (layer.layer() < 2) {
          EXPECT_THAT(holders, ::testing::ElementsAre("host-1:7000", "host-3:7000"));
        } else {  // rank 3's worker (host-4) was lost
          EXPECT_THAT(holders, ::testing::ElementsAre("host-2:7000"));
        }
      }
    }
  }
  EXPECT_EQ(assigned, 4);
  EXPECT_THAT(EventTexts(job_), Contains(HasSubstr("the ranks take the survivors' state at step "
                                                   "6 from the 3 workers holding it")));
  EXPECT_THAT(held_jobs(0), ::testing::ElementsAre(job_)) << "step 6 is not committed yet";
  // Generation 2 commits step 6: the holds are let go.
  for (int n = 1; n <= 5; ++n) {
    for (const v1::StageAssignment& a : Worker(n).assigned) {
      if (a.generation() != 2) continue;
      v1::StepReport report = Report(w_[n - 1], job_, a.rank(), 6);
      report.set_generation(2);
      if (a.rank() == 0) report.set_state_from_replicas("its state at step 6 from the survivors");
      if (a.rank() % 2 == 1) {
        report.set_has_loss(true);
        report.set_loss(1.0);
      }
      ASSERT_TRUE(ReportSteps(sessions_[w_[n - 1]], {report}).ok());
    }
  }
  ASSERT_EQ(Get(job_).step(), 6);
  EXPECT_THAT(EventTexts(job_), Contains(HasSubstr("took its state at step 6 from the survivors")));
  EXPECT_TRUE(held_jobs(0).empty());
  EXPECT_TRUE(held_jobs(2).empty());
}

// The negative control: rank 0 applied step 5's update while rank 1 neither did nor holds
// it (no commit): no step every place stands at. The survivors are told to abandon, and the
// job restarts from the checkpoint before step 3, steps 3 and 4 to run again.
TEST_F(SurvivorsTest, SurvivorsThatCannotAgreeRestartFromTheLastCheckpoint) {
  StartJob();
  Stopped(0, 6, -1);
  LoseRankThree();
  Stopped(1, 5, -1);
  const v1::SurvivorInstruction two = Stopped(2, 6, -1);
  ASSERT_EQ(two.action(), v1::SurvivorInstruction::ABANDON);
  EXPECT_THAT(two.reason(), HasSubstr("no step is one every stage's survivors can stand at"));
  EXPECT_EQ(Stopped(0, 6, -1).action(), v1::SurvivorInstruction::ABANDON);
  for (int rank : {0, 1, 2}) End(rank);
  EXPECT_THAT(EventTexts(job_), Contains(HasSubstr("the survivors cannot go on")));
  RunLater();
  EXPECT_TRUE(Generation2().empty()) << "a restart from the checkpoint waits for the lease";
  PastTheLease();
  const std::vector<v1::StageAssignment> next = Generation2();
  ASSERT_EQ(next.size(), 4u);
  for (const v1::StageAssignment& a : next) {
    EXPECT_EQ(a.spec().resume_from(), "/ckpt/step-00000003");
    EXPECT_EQ(a.replica_state().layers_size(), 0) << "nothing held: it reads the checkpoint";
  }
  EXPECT_FALSE(Get(job_).recoveries(0).from_survivors());
  EXPECT_EQ(Get(job_).recoveries(0).resumed_at_step(), 3);
}

// A writer whose part failed: the restart point stays at the last checkpoint, and the job's
// events say why.
TEST_F(SurvivorsTest, ASurvivorsWriteThatFailedLeavesTheRestartPoint) {
  StartJob();
  LoseRankThree();
  for (int rank : {0, 1, 2}) Stopped(rank, 5, -1);
  ASSERT_EQ(Stopped(0, 5, -1).action(), v1::SurvivorInstruction::GO_ON);
  End(0, "", -1, "disk full");
  End(1);
  End(2);
  EXPECT_THAT(EventTexts(job_), Contains(HasSubstr("was not written: stage 0 replica 0")));
  EXPECT_EQ(Get(job_).checkpoint_step(), 3);
  EXPECT_FALSE(Get(job_).recoveries(0).from_survivors());
  // The plan was announced and not carried out: the next generation's start says so, and
  // nothing says the survivors went on.
  PastTheLease();
  ASSERT_FALSE(Generation2().empty());
  EXPECT_THAT(EventTexts(job_),
              Contains(HasSubstr("the survivors did not go on from step 5 (their state was not "
                                 "committed): generation 2 starts at step 3")));
  EXPECT_THAT(EventTexts(job_), Not(Contains(HasSubstr("the survivors go on from"))));
}

// A rank that never reports (hung): the round decides three heartbeat intervals after the
// generation ended, without it; here the place it leaves has another replica.
TEST_F(SurvivorsTest, ARankThatNeverReportsIsPassedOverAtTheDeadline) {
  StartJob();
  LoseRankThree();
  Stopped(0, 5, -1);
  Stopped(1, 5, -1);
  EXPECT_EQ(Stopped(0, 5, -1).action(), v1::SurvivorInstruction::WAIT);
  for (int beat = 0; beat < 4; ++beat) {  // rank 2's worker is alive: only its stage hangs
    clock_->Advance(absl::Milliseconds(800));
    for (int n : {0, 1, 2, 4}) Heartbeat(w_[n]);
    coordinator_->Tick();
  }
  const v1::SurvivorInstruction go = Stopped(1, 5, -1);
  ASSERT_EQ(go.action(), v1::SurvivorInstruction::GO_ON);
  EXPECT_EQ(go.step(), 5);
  EXPECT_TRUE(go.write_state());
  EXPECT_THAT(EventTexts(job_), Contains(HasSubstr("without the ranks that did not report")));
  // Its report after the plan: told to abandon.
  EXPECT_EQ(Stopped(2, 5, -1).action(), v1::SurvivorInstruction::ABANDON);
}

// Without restarts left (or replicas) there is nothing to keep: no commit, and a stopped
// rank's report is answered ABANDON.
TEST_F(SurvivorsTest, AJobWithoutRestartsKeepsNoSurvivors) {
  StartJob("1f1b", /*max_restarts=*/0);
  EXPECT_FALSE(Worker(1).assigned[0].commit_steps());
  const v1::SurvivorInstruction answer = Stopped(0, 5, -1);
  EXPECT_EQ(answer.action(), v1::SurvivorInstruction::ABANDON);
  EXPECT_THAT(answer.reason(), HasSubstr("does not commit its steps"));
}

// Pipedream's updates follow its micro-batches' versions: no commit under it.
TEST_F(SurvivorsTest, PipeDreamKeepsNoSurvivors) {
  StartJob("pipedream");
  EXPECT_FALSE(Worker(1).assigned[0].commit_steps());
}

}  // namespace
}  // namespace pipetrain::coordinator::core_test
