// Going on from the survivors of a lost rank, with the step commit (StageConfig::commit_steps;
// job::Generation), stages as threads: a job of 2 stages x 3 replicas (float64, AdamW, dropout)
// loses one rank of replica 1 at a point of its schedule (a forward, a backward, the gradient
// AllReduce, the commit itself, just after it); the survivors agree on a step
// (recovery::PlanSurvivorStep), those holding its update apply it, the lowest surviving replica of
// each stage writes the state at that step, and the job goes on from it on 2 replicas with the
// global batch kept (3 micro-batches each instead of 2; DualPipeV, which needs m >= 4 on 2 ranks, 6
// instead of 4). It ends within 1e-10 of the run that never failed, with every step run exactly
// once, no step before the one in progress lost, under every kind of schedule the commit runs under
// (all but pipedream);
// also under ZB-V lost at the commit with tied weights and clipping. The commit changes no
// bit of a run that does not fail. Negative control: without the commit, a stage updates a step its
// neighbour never will, and the plan is refused. (Over Gloo: survivor_recovery_gloo_test.cc.)
#include <atomic>
#include <chrono>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <thread>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/synchronization/notification.h"
#include "runtime/checkpoint/checkpoint_dir.h"
#include "runtime/checkpoint/job_checkpoints.h"
#include "runtime/job/launch/in_process.h"
#include "runtime/job/plan.h"
#include "runtime/job/reference/reference_trainer.h"
#include "runtime/recovery/survivor_step.h"
#include "tests/pipeline/forwarding_transport.h"
#include "tests/pipeline/schedule_cases.h"
#include "tests/pipeline/survivor_fixture.h"

namespace pipetrain::job::survivor_test {
namespace {

using ::testing::HasSubstr;

struct SurvivorRun {
  absl::Status failure;                       // the run's
  std::vector<recovery::Survivor> survivors;  // as they stood, before any applied its update
  absl::StatusOr<recovery::SurvivorPlan> plan = absl::UnknownError("no failure");
  absl::Status saved = absl::UnknownError("not saved");
};

using TransportWrapper = std::function<std::unique_ptr<transport::Transport>(
    std::unique_ptr<transport::Transport>, int index)>;

// How RunAndLose loses its rank, beyond the fault.
struct Losing {
  std::function<void()> before_dying;  // run on the dying rank's thread before it dies
  std::function<void()> after_dying;   // and once its peers' waits have been aborted
  TransportWrapper wrap_survivor;      // wraps the other ranks' transports (index r * p + s)
  bool apply_held = true;              // false: survivors skip their held updates
};

// Runs `c` with rank (fault.stage, replica 1) dying at the fault; the survivors' plan is
// carried out as a host would: held updates applied, each stage's source writes its layers
// into c.checkpoint().dir() at the plan's step.
SurvivorRun RunAndLose(const JobSpec& c, const Fault& fault, const Losing& losing = {},
                       bool commit = true) {
  constexpr int kLostReplica = 1;
  const int lost = kLostReplica * kStages + fault.stage;
  SurvivorRun out;
  RunOptions options;
  options.generation.commit_steps = commit;
  auto built = std::make_shared<int>(0);  // wrap_transport is called replica-major
  options.wrap_transport = [=](std::unique_ptr<transport::Transport> t, int) {
    const int index = (*built)++;
    if (index != lost)
      return losing.wrap_survivor ? losing.wrap_survivor(std::move(t), index) : std::move(t);
    return std::unique_ptr<transport::Transport>(
        new DyingTransport(std::move(t), c, fault, losing.before_dying, losing.after_dying));
  };
  options.on_failure = [&](const std::vector<StoppedRank>& ranks) {
    for (int i = 0; i < static_cast<int>(ranks.size()); ++i) {
      if (i == lost) continue;
      out.survivors.push_back({i % kStages, i / kStages, ranks[i].state});
    }
    out.plan = recovery::PlanSurvivorStep(out.survivors, kStages);
    if (!out.plan.ok()) return;
    // Indices into the survivors, back to ranks: every index past the lost one is one more.
    const auto rank_of = [&](int survivor) { return survivor < lost ? survivor : survivor + 1; };
    for (int s : losing.apply_held ? out.plan->apply_held : std::vector<int>{}) {
      if (absl::Status applied = ranks[rank_of(s)].apply_held_update(); !applied.ok()) {
        out.saved = applied;
        return;
      }
    }
    absl::StatusOr<JobPlan> job_plan = MakeJobPlan(c);
    if (!job_plan.ok()) {
      out.saved = job_plan.status();
      return;
    }
    checkpoint::CheckpointSink sink(c, *job_plan);
    out.saved = absl::OkStatus();
    for (int source : out.plan->sources) {
      for (const auto& [stage, weights] : ranks[rank_of(source)].model_stages) {
        absl::Status delivered = sink.Deliver(out.plan->step, stage, *weights);
        if (out.saved.ok()) out.saved = delivered;
      }
    }
  };
  absl::StatusOr<JobReport> report = RunInProcess(c, options);
  out.failure = report.status();
  return out;
}

// The job continued on the survivors from `step`: it runs every step after it once; returns
// the largest relative difference of its final parameters from `whole`'s (infinite if it
// failed).
double ContinueOnTheSurvivors(const JobSpec& job, const JobReport& whole, int64_t step) {
  absl::StatusOr<JobReport> finished = RunInProcess(OnTheSurvivors(job, step), Committed());
  EXPECT_TRUE(finished.ok()) << finished.status();
  if (!finished.ok()) return std::numeric_limits<double>::infinity();
  EXPECT_EQ(finished->first_step, step);
  EXPECT_EQ(finished->first_step + static_cast<int64_t>(finished->losses.size()), kSteps);
  return MaxRelativeDifference(finished->final_parameters, whole.final_parameters);
}

// Every kind the step commit runs under (CommitStepsRefusal) that takes both the job's layout
// and the survivors' (m micro-batches and 3/2 m on 2 ranks: MicroBatchesFor).
std::vector<ScheduleKind> KindsTheSurvivorsGoOnUnder() {
  std::vector<ScheduleKind> kinds;
  for (const ScheduleKind kind : schedule::kScheduleKinds) {
    const JobSpec job = Job(kind, "");
    const JobSpec survivors = OnTheSurvivors(job, 1);
    if (CommitStepsRefusal(job).empty() &&
        pipeline_test::TakesLayout(kind, PipelineStages(job), 0, job.microbatches()) &&
        pipeline_test::TakesLayout(kind, PipelineStages(survivors), 0, survivors.microbatches())) {
      kinds.push_back(kind);
    }
  }
  return kinds;
}

class SurvivorRecoveryTest : public ::testing::TestWithParam<ScheduleKind> {};

TEST_P(SurvivorRecoveryTest, ALostRankCostsNoStep) {
  const fs::path dir = TempDir("lost");
  const JobSpec job = Job(GetParam(), dir);
  absl::StatusOr<JobReport> whole = RunInProcess(job, Committed());
  ASSERT_TRUE(whole.ok()) << whole.status();
  // The commit changes nothing a run computes.
  absl::StatusOr<JobReport> plain = RunInProcess(job);
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_EQ(whole->final_parameters.size(), plain->final_parameters.size());
  for (size_t k = 0; k < whole->final_parameters.size(); ++k) {
    EXPECT_TRUE(at::equal(whole->final_parameters[k], plain->final_parameters[k])) << k;
  }
  // Every rank of the last model stage (rank 0 under a V) knows each step's loss as the job
  // reports it (the replicas' mean: summed in the order their reports arrive, hence not
  // bitwise).
  const schedule::ChunkLayout layout = schedule::LayoutOf(ScheduleParamsOf(job, job.steps()));
  const int last = layout.RankOf(layout.stages() - 1);
  for (int r = 0; r < kReplicas; ++r) {
    for (int s = 0; s < kStages; ++s) {
      for (const executor::StepRecord& step : whole->stage_stats[r * kStages + s].steps) {
        if (s != last) {
          EXPECT_FALSE(step.job_loss.has_value());
          continue;
        }
        ASSERT_TRUE(step.job_loss.has_value()) << "replica " << r << " step " << step.step;
        EXPECT_NEAR(*step.job_loss, whole->losses[step.step], 1e-12);
      }
    }
  }
  // (The reported loss is the replicas' mean, summed as their reports arrive.)
  ASSERT_EQ(whole->losses.size(), plain->losses.size());
  for (size_t t = 0; t < whole->losses.size(); ++t) {
    EXPECT_NEAR(whole->losses[t], plain->losses[t], 1e-12) << t;
  }

  for (const Fault& fault :
       {Fault{Point::kForward, 2, 0, 2, 2}, Fault{Point::kBackward, 2, 1, 2, 2},
        Fault{Point::kGradientAllReduce, 3, 1, 3, 3}, Fault{Point::kCommitMessage, 3, 0, 3, 4},
        Fault{Point::kAfterCommit, 3, 0, 4, 4}}) {
    SCOPED_TRACE(testing::Message() << "stage " << fault.stage << " of replica 1 lost at point "
                                    << static_cast<int>(fault.point) << " of step " << fault.step);
    fs::remove_all(dir);
    SurvivorRun lost = RunAndLose(job, fault);
    ASSERT_FALSE(lost.failure.ok());
    EXPECT_THAT(lost.failure.message(), HasSubstr("the rank was killed"));
    ASSERT_TRUE(lost.plan.ok()) << lost.plan.status();
    ASSERT_TRUE(lost.saved.ok()) << lost.saved;
    // No step before the one in progress is lost (after the commit the next one is).
    EXPECT_GE(lost.plan->step, fault.first_expected);
    EXPECT_LE(lost.plan->step, fault.last_expected);

    absl::StatusOr<JobReport> finished =
        RunInProcess(OnTheSurvivors(job, lost.plan->step), Committed());
    ASSERT_TRUE(finished.ok()) << finished.status();
    EXPECT_EQ(finished->first_step, lost.plan->step);
    EXPECT_EQ(finished->first_step + static_cast<int64_t>(finished->losses.size()), kSteps);
    EXPECT_LE(MaxRelativeDifference(finished->final_parameters, whole->final_parameters), 1e-10);
    for (size_t t = 0; t < finished->losses.size(); ++t) {
      EXPECT_NEAR(finished->losses[t], whole->losses[finished->first_step + t], 1e-10) << t;
    }
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Schedules, SurvivorRecoveryTest,
                         ::testing::ValuesIn(KindsTheSurvivorsGoOnUnder()), [](const auto& info) {
                           return std::string(schedule::ScheduleKindName(info.param));
                         });

// Stage 1 of replica 0 waits out its commit of step 3 until the lost rank (stage 0 of
// replica 1) has passed it and died in step 4: it is left holding step 3's update, which the
// others applied, and the plan has it apply that (its state is what the job goes on from:
// the lowest surviving replica of stage 1). Negative control: not applied, the job misses.
TEST(SurvivorRecovery, ASurvivorThatMissedTheCommitsEndAppliesItsHeldUpdate) {
  const fs::path dir = TempDir("held");
  const JobSpec job = Job(ScheduleKind::kOneFOneB, dir);
  absl::StatusOr<JobReport> whole = RunInProcess(job, Committed());
  ASSERT_TRUE(whole.ok()) << whole.status();
  // Holds its commit's result back until the lost rank has died.
  class Sluggish : public ForwardingTransport {
   public:
    Sluggish(std::unique_ptr<transport::Transport> inner, std::shared_ptr<absl::Notification> died)
        : ForwardingTransport(std::move(inner)), died_(std::move(died)) {}
    // The commit's barrier among the replicas (one int64 a rank, once a step): step 3's
    // completes with every replica in it (the lost rank then applies the step and dies), but
    // its result is held back until the lost rank has died, and is then the failure the
    // aborted transport gives (what a receive of nothing says now), as if the end came late.
    absl::StatusOr<std::vector<at::Tensor>> AllGather(const transport::Group& group,
                                                      const at::Tensor& mine,
                                                      absl::Time deadline) override {
      absl::StatusOr<std::vector<at::Tensor>> got = inner_->AllGather(group, mine, deadline);
      const bool commit = group.replicas() && mine.scalar_type() == at::kLong && mine.numel() == 1;
      if (!commit || commits_++ != 3) return got;
      died_->WaitForNotificationWithTimeout(absl::Seconds(30));
      return inner_->Recv(0, MessageKind::kActivation, -1, absl::InfinitePast()).status();
    }

   private:
    std::shared_ptr<absl::Notification> died_;
    int64_t commits_ = 0;
  };
  for (bool apply : {true, false}) {
    SCOPED_TRACE(apply ? "held update applied" : "held update not applied");
    fs::remove_all(dir);
    auto died = std::make_shared<absl::Notification>();
    Losing losing;
    losing.after_dying = [died] { died->Notify(); };
    losing.wrap_survivor = [died](std::unique_ptr<transport::Transport> t, int index) {
      if (index != 0 * kStages + 1) return t;
      return std::unique_ptr<transport::Transport>(new Sluggish(std::move(t), died));
    };
    losing.apply_held = apply;
    SurvivorRun lost = RunAndLose(job, {Point::kAfterCommit, 3, 0, 4, 4}, losing);
    ASSERT_TRUE(died->HasBeenNotified());
    ASSERT_TRUE(lost.plan.ok()) << lost.plan.status();
    ASSERT_TRUE(lost.saved.ok()) << lost.saved;
    EXPECT_EQ(lost.plan->step, 4);
    ASSERT_EQ(lost.survivors[1].rank, 1);
    ASSERT_EQ(lost.survivors[1].replica, 0);
    EXPECT_EQ(lost.survivors[1].state.next_step, 3);
    EXPECT_EQ(lost.survivors[1].state.held_step, 3);
    EXPECT_THAT(lost.plan->apply_held, ::testing::Contains(1));
    EXPECT_EQ(lost.plan->sources[1], 1);
    const double difference = ContinueOnTheSurvivors(job, *whole, 4);
    if (apply) {
      EXPECT_LE(difference, 1e-10);
    } else {
      EXPECT_GT(difference, 1e-4);
    }
  }
  fs::remove_all(dir);
}

// Stage 1 of replica 1 dies entering step 3's commit once every other rank has entered it: every
// survivor holds step 3's final gradient and none has applied it. The step is completed, not run
// again: every survivor applies its held update. The last stage's survivors hold the step's loss as
// the job reports it too.
TEST(SurvivorRecovery, AStepEveryRankHoldsIsCompletedThoughNoOneAppliedIt) {
  const fs::path dir = TempDir("all_hold");
  const JobSpec job = Job(ScheduleKind::kOneFOneB, dir);
  absl::StatusOr<JobReport> whole = RunInProcess(job, Committed());
  ASSERT_TRUE(whole.ok()) << whole.status();
  auto sent = std::make_shared<std::atomic<int>>(0);  // ranks in step 3's commit barrier
  class Counting : public ForwardingTransport {
   public:
    Counting(std::unique_ptr<transport::Transport> inner, std::shared_ptr<std::atomic<int>> n)
        : ForwardingTransport(std::move(inner)), n_(std::move(n)) {}
    absl::StatusOr<std::vector<at::Tensor>> AllGather(const transport::Group& group,
                                                      const at::Tensor& mine,
                                                      absl::Time deadline) override {
      // The commit's barrier of the pipeline (one int64, once a step): counted on the way in.
      if (!group.replicas() && group.stages().empty() && mine.scalar_type() == at::kLong &&
          barriers_++ == 3) {
        ++*n_;
      }
      return inner_->AllGather(group, mine, deadline);
    }

   private:
    std::shared_ptr<std::atomic<int>> n_;
    int64_t barriers_ = 0;
  };
  Losing losing;
  losing.wrap_survivor = [sent](std::unique_ptr<transport::Transport> t, int) {
    return std::unique_ptr<transport::Transport>(new Counting(std::move(t), sent));
  };
  // Each of the 5 others enters it.
  losing.before_dying = [sent] {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (sent->load() < kStages * kReplicas - 1 && absl::Now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  };
  SurvivorRun lost = RunAndLose(job, {Point::kCommitMessage, 3, 1, 4, 4}, losing);
  ASSERT_EQ(sent->load(), kStages * kReplicas - 1);
  // The last stage's survivors know the completed step's loss, though its reports never came.
  for (const recovery::Survivor& s : lost.survivors) {
    EXPECT_EQ(s.state.next_step, 3);
    EXPECT_EQ(s.state.held_step, 3);
    if (s.rank == kStages - 1) {
      ASSERT_TRUE(s.state.held_loss.has_value()) << "replica " << s.replica;
      EXPECT_NEAR(*s.state.held_loss, whole->losses[3], 1e-12);
    } else {
      EXPECT_FALSE(s.state.held_loss.has_value());
    }
  }
  ASSERT_TRUE(lost.plan.ok()) << lost.plan.status();
  ASSERT_TRUE(lost.saved.ok()) << lost.saved;
  EXPECT_EQ(lost.plan->step, 4);
  EXPECT_EQ(lost.plan->apply_held.size(), lost.survivors.size());
  EXPECT_LE(ContinueOnTheSurvivors(job, *whole, 4), 1e-10);
  fs::remove_all(dir);
}

// Ranks holding two model stages each (ZB-V: I and W, chunks' AllReduces started during the
// step): stage 1 of replica 1 dies entering step 3's commit; the survivors go on
// from step 3 or 4 and end within 1e-10 of the run without a fault.
TEST(SurvivorRecovery, UnderZeroBubbleVTheSurvivorsLoseNoStep) {
  const fs::path dir = TempDir("zbv");
  JobSpec job = Job(ScheduleKind::kZeroBubbleV, dir);
  job.set_virtual_stages(2);
  absl::StatusOr<JobReport> whole = RunInProcess(job, Committed());
  ASSERT_TRUE(whole.ok()) << whole.status();
  SurvivorRun lost = RunAndLose(job, {Point::kCommitMessage, 3, 1, 3, 4});
  ASSERT_FALSE(lost.failure.ok());
  EXPECT_THAT(lost.failure.message(), HasSubstr("the rank was killed"));
  ASSERT_TRUE(lost.plan.ok()) << lost.plan.status();
  ASSERT_TRUE(lost.saved.ok()) << lost.saved;
  EXPECT_GE(lost.plan->step, 3);
  EXPECT_LE(lost.plan->step, 4);
  EXPECT_LE(ContinueOnTheSurvivors(job, *whole, lost.plan->step), 1e-10);
  fs::remove_all(dir);
}

// With the whole recipe that runs before the commit: the LM head tied to the embedding (their
// gradients summed across the ranks) and the pipeline's gradient clipped to a norm the steps
// exceed. A rank lost in a backward, in its gradient AllReduce and after its commit: the
// survivors end within 1e-10 of the run without a fault.
TEST(SurvivorRecovery, WithTiedWeightsAndClippingTheSurvivorsLoseNoStep) {
  const fs::path dir = TempDir("recipe");
  JobSpec job = Job(ScheduleKind::kOneFOneB, dir);
  job.mutable_model()->set_tie_embeddings(true);
  job.mutable_optimizer()->set_clip_grad_norm(0.05);
  absl::StatusOr<JobReport> whole = RunInProcess(job, Committed());
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_FALSE(whole->grad_norms.empty());
  EXPECT_GT(whole->grad_norms.front(), job.optimizer().clip_grad_norm());  // clipping acts
  for (const Fault& fault :
       {Fault{Point::kBackward, 2, 1, 2, 2}, Fault{Point::kGradientAllReduce, 3, 1, 3, 3},
        Fault{Point::kAfterCommit, 3, 0, 4, 4}}) {
    SCOPED_TRACE(testing::Message() << "stage " << fault.stage << " of replica 1 lost at point "
                                    << static_cast<int>(fault.point) << " of step " << fault.step);
    fs::remove_all(dir);
    SurvivorRun lost = RunAndLose(job, fault);
    ASSERT_FALSE(lost.failure.ok());
    ASSERT_TRUE(lost.plan.ok()) << lost.plan.status();
    ASSERT_TRUE(lost.saved.ok()) << lost.saved;
    EXPECT_GE(lost.plan->step, fault.first_expected);
    EXPECT_LE(lost.plan->step, fault.last_expected);
    EXPECT_LE(ContinueOnTheSurvivors(job, *whole, lost.plan->step), 1e-10);
  }
  fs::remove_all(dir);
}

// Negative control: without the commit, stage 1 applies step 3's update as soon as its own
// replicas have averaged it, while stage 0 of replica 1 dies in step 3's AllReduce (held
// there until stage 1 has moved on): no replica's weights are one step, and the plan says so.
TEST(SurvivorRecovery, WithoutTheCommitTheSurvivorsHoldNoOneStep) {
  const fs::path dir = TempDir("uncommitted");
  JobSpec job = Job(ScheduleKind::kOneFOneB, dir);
  // Stage 1's ranks post their receive of step 4's first activation after their update of
  // step 3; the dying rank waits for all three (its own pipeline's too) to get there.
  auto stage1_moved_on = std::make_shared<std::atomic<int>>(0);
  class Watching : public ForwardingTransport {
   public:
    Watching(std::unique_ptr<transport::Transport> inner, std::shared_ptr<std::atomic<int>> n)
        : ForwardingTransport(std::move(inner)), n_(std::move(n)) {}
    absl::StatusOr<at::Tensor> Recv(int peer, MessageKind kind, int64_t j,
                                    absl::Time deadline) override {
      if (kind == MessageKind::kActivation && j == 4 * kMicroBatches) ++*n_;
      return inner_->Recv(peer, kind, j, deadline);
    }

   private:
    std::shared_ptr<std::atomic<int>> n_;
  };
  Losing losing;
  losing.before_dying = [stage1_moved_on] {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (stage1_moved_on->load() < kReplicas && absl::Now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  };
  losing.wrap_survivor = [stage1_moved_on](std::unique_ptr<transport::Transport> t, int index) {
    if (index % kStages != 1) return t;
    return std::unique_ptr<transport::Transport>(new Watching(std::move(t), stage1_moved_on));
  };
  SurvivorRun lost = RunAndLose(job, {Point::kGradientAllReduce, 3, 0, -1, -1}, losing,
                                /*commit=*/false);
  ASSERT_FALSE(lost.failure.ok());
  ASSERT_GE(stage1_moved_on->load(), kReplicas) << "stage 1 did not update step 3 in 30 s";
  // The hazard: stage 1 stands at W(4), stage 0 at W(3) holding no final gradient.
  for (const recovery::Survivor& s : lost.survivors) {
    EXPECT_EQ(s.state.next_step, s.rank == 1 ? 4 : 3)
        << "rank " << s.rank << " replica " << s.replica;
    EXPECT_EQ(s.state.held_step, -1);
  }
  ASSERT_FALSE(lost.plan.ok());
  EXPECT_THAT(lost.plan.status().message(),
              HasSubstr("no step is one every stage's survivors can stand at (stage 0 at step 3; "
                        "stage 1 at step 4)"));
  fs::remove_all(dir);
}
}  // namespace
}  // namespace pipetrain::job::survivor_test
