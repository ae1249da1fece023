// The step commit and going on from the survivors of a lost rank over Gloo: every rank through
// RunStage (as stage processes and worker daemons run them), as threads meeting in one memory
// store. The commit changes no bit; a rank of 2 stages x 3 replicas (float64, AdamW,
// dropout) lost at a point of 1F1B's schedule, its connections closing, leaves survivors whose
// state at the step they agree on continues the job within 1e-10 of the run without a fault.
#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/cord.h"
#include "absl/synchronization/mutex.h"
#include "runtime/checkpoint/checkpoint_dir.h"
#include "runtime/checkpoint/job_checkpoints.h"
#include "runtime/job/launch/in_process.h"
#include "runtime/job/launch/stage_run.h"
#include "runtime/job/plan.h"
#include "runtime/job/reference/reference_trainer.h"
#include "runtime/recovery/survivor_step.h"
#include "runtime/rendezvous/key_value_store.h"
#include "tests/pipeline/survivor_fixture.h"

namespace pipetrain::job::survivor_test {
namespace {

using ::testing::HasSubstr;

// Every rank of `c` through RunStage (the Gloo transport, as stage processes and workers run
// them), as threads meeting in one memory store: each rank's outcome, replica-major.
std::vector<StageOutcome> RunOverGloo(const JobSpec& c, bool commit) {
  std::shared_ptr<rendezvous::KeyValueStore> store = rendezvous::MakeMemoryStore();
  const int n = PipelineStages(c) * c.replicas();
  std::vector<absl::StatusOr<StageOutcome>> outcomes(n, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&, rank] {
      StageRunOptions options;
      options.generation.commit_steps = commit;
      outcomes[rank] = RunStage(c, rank, store, options);
    });
  }
  for (std::thread& t : threads) t.join();
  std::vector<StageOutcome> out;
  for (int rank = 0; rank < n; ++rank) {
    EXPECT_TRUE(outcomes[rank].ok()) << "rank " << rank << ": " << outcomes[rank].status();
    if (outcomes[rank].ok()) out.push_back(*std::move(outcomes[rank]));
  }
  return out;
}

// The commit's messages and AllReduce over Gloo: every rank of 2 stages x 3 replicas ends with
// the same parameters, bit for bit, as without the commit.
TEST(StepCommit, OverGlooChangesNoBit) {
  JobSpec job = Job(ScheduleKind::kOneFOneB, TempDir("gloo"));
  job.mutable_checkpoint()->set_dir("");
  job.set_steps(3);
  const std::vector<StageOutcome> committed = RunOverGloo(job, /*commit=*/true);
  const std::vector<StageOutcome> plain = RunOverGloo(job, /*commit=*/false);
  ASSERT_EQ(committed.size(), static_cast<size_t>(kStages * kReplicas));
  ASSERT_EQ(plain.size(), committed.size());
  for (size_t rank = 0; rank < plain.size(); ++rank) {
    ASSERT_EQ(committed[rank].parameters.size(), plain[rank].parameters.size());
    for (size_t k = 0; k < plain[rank].parameters.size(); ++k) {
      EXPECT_TRUE(at::equal(committed[rank].parameters[k], plain[rank].parameters[k]))
          << "rank " << rank << " parameter " << k;
    }
  }
}

// Hears a rank's failure: what a host going on from the survivors does with it.
class ActAsSurvivor : public StageListener {
 public:
  explicit ActAsSurvivor(std::function<void(const StoppedRank&)> act) : act_(std::move(act)) {}
  void Stopped(const StoppedRank& rank) override { act_(rank); }

 private:
  std::function<void(const StoppedRank&)> act_;
};

// Ranks through RunStage over Gloo, as threads: a rank of replica 1 dies at a point (a
// forward, its gradient AllReduce, the commit, after it), and its connections close as its
// RunStage returns. As the
// coordinator does on a fault, the first survivor to stop stops the others. Each survivor
// (StageListener::Stopped) reports its state and waits for the plan, applies its held
// update if told to, and the sources write their layers through the store at the plan's
// step (DeliverStoppedRank); each hook sees the error RunStage returns, attributed to the
// lost rank; the job goes on from there on 2 replicas within 1e-10 of the run without a fault.
void LoseOverGloo(const JobSpec& job, const JobReport& whole, const Fault& fault) {
  const fs::path dir = job.checkpoint().dir();
  fs::remove_all(dir);
  const int n = kStages * kReplicas, lost = 1 * kStages + fault.stage;
  std::shared_ptr<rendezvous::KeyValueStore> store = rendezvous::MakeMemoryStore();
  absl::Mutex mu;
  std::vector<std::unique_ptr<StageHandle>> handles;
  for (int rank = 0; rank < n; ++rank) handles.push_back(std::make_unique<StageHandle>());
  std::vector<recovery::Survivor> survivors;
  std::vector<int> survivor_ranks;
  std::optional<absl::StatusOr<recovery::SurvivorPlan>> plan;
  std::vector<absl::Status> carried_out(n);
  std::string committed;
  std::vector<absl::Status> ended(n);
  std::vector<absl::Status> errors(n, absl::UnknownError("no hook"));  // StoppedRank::error
  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&, rank] {
      StageRunOptions options;
      options.generation.commit_steps = true;
      options.handle = handles[rank].get();
      if (rank == lost) {
        options.wrap_transport = [&](std::unique_ptr<transport::Transport> t) {
          return std::unique_ptr<transport::Transport>(
              new DyingTransport(std::move(t), job, fault, nullptr, nullptr));
        };
      }
      ActAsSurvivor listener([&, rank](const StoppedRank& stopped) {
        errors[rank] = stopped.error;
        if (rank == lost) return;  // it is gone
        int me = -1;
        {
          absl::MutexLock lock(&mu);
          for (const std::unique_ptr<StageHandle>& handle : handles) {
            handle->Stop(absl::UnavailableError("a peer was lost"));
          }
          me = static_cast<int>(survivors.size());
          survivors.push_back({rank % kStages, rank / kStages, stopped.state});
          survivor_ranks.push_back(rank);
          const auto all_reported = [&] { return survivors.size() == static_cast<size_t>(n - 1); };
          if (!mu.AwaitWithTimeout(absl::Condition(&all_reported), absl::Seconds(60))) {
            carried_out[rank] = absl::DeadlineExceededError("not every survivor reported");
            return;
          }
          if (!plan) plan = recovery::PlanSurvivorStep(survivors, kStages);
          if (!plan->ok()) return;
        }
        const recovery::SurvivorPlan& go = **plan;  // written once, read after
        const auto& held = go.apply_held;
        if (std::find(held.begin(), held.end(), me) != held.end()) {
          carried_out[rank] = stopped.apply_held_update();
          if (!carried_out[rank].ok()) return;
        }
        if (go.sources[static_cast<size_t>(rank % kStages)] != me) return;
        checkpoint::SharedCheckpointResult saved =
            DeliverStoppedRank(*store, job, stopped, go.step, /*generation=*/0);
        if (carried_out[rank].ok()) carried_out[rank] = saved.status;
        if (!saved.committed.empty()) {
          absl::MutexLock lock(&mu);
          committed = saved.committed;
        }
      });
      options.listener = &listener;
      ended[rank] = RunStage(job, rank, store, options).status();
    });
  }
  for (std::thread& t : threads) t.join();

  EXPECT_THAT(ended[lost].message(), HasSubstr("the rank was killed"));
  for (int rank = 0; rank < n; ++rank) {
    EXPECT_FALSE(ended[rank].ok()) << rank;
    EXPECT_TRUE(carried_out[rank].ok()) << "rank " << rank << ": " << carried_out[rank];
    // The hook saw the error RunStage returns: the lost rank failed first, the others say so.
    EXPECT_EQ(errors[rank], ended[rank]) << rank;
    if (rank != lost) {
      EXPECT_EQ(errors[rank].GetPayload(kFailedAfterPeerPayload), absl::Cord(std::to_string(lost)))
          << "rank " << rank << ": " << errors[rank];
    }
  }
  ASSERT_TRUE(plan.has_value());
  ASSERT_TRUE(plan->ok()) << plan->status();
  EXPECT_GE((*plan)->step, fault.first_expected);
  EXPECT_LE((*plan)->step, fault.last_expected);
  EXPECT_EQ(fs::path(committed).filename(), checkpoint::StepDirName((*plan)->step));
  absl::StatusOr<JobReport> finished =
      RunInProcess(OnTheSurvivors(job, (*plan)->step), Committed());
  ASSERT_TRUE(finished.ok()) << finished.status();
  EXPECT_EQ(finished->first_step + static_cast<int64_t>(finished->losses.size()), kSteps);
  EXPECT_LE(MaxRelativeDifference(finished->final_parameters, whole.final_parameters), 1e-10);
}

TEST(SurvivorRecovery, OverGlooTheSurvivorsOfARankWhoseConnectionsClosedLoseNoStep) {
  const fs::path dir = TempDir("gloo_lost");
  const JobSpec job = Job(ScheduleKind::kOneFOneB, dir);
  absl::StatusOr<JobReport> whole = RunInProcess(job, Committed());
  ASSERT_TRUE(whole.ok()) << whole.status();
  for (const Fault& fault :
       {Fault{Point::kForward, 2, 0, 2, 2}, Fault{Point::kGradientAllReduce, 3, 1, 3, 3},
        Fault{Point::kCommitMessage, 3, 1, 3, 4}, Fault{Point::kAfterCommit, 3, 0, 4, 4}}) {
    SCOPED_TRACE(testing::Message() << "stage " << fault.stage << " of replica 1 lost at point "
                                    << static_cast<int>(fault.point) << " of step " << fault.step);
    LoseOverGloo(job, *whole, fault);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace pipetrain::job::survivor_test
