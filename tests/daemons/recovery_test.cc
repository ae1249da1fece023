// Automatic recovery with real daemons on loopback (local_cluster.h): a worker SIGKILLed
// mid-step, another SIGSTOPped (hung), the coordinator SIGKILLed and restarted, and 25
// kill/rejoin cycles during one job. Each time the job finishes by itself, restarted from its
// latest checkpoint, and its final parameters equal a run without faults (float64, 1e-10:
// the data order and the arithmetic do not depend on the layout). The steps the coordinator
// committed are read from its SQLite file: every step exactly once, generations increasing.
// Checkpoints that fail or cannot be read are tested in recovery_checkpoints_test.cc; the
// fixture is in recovery_fixture.h.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <utility>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "pipetrain/v1/job_service.grpc.pb.h"
#include "runtime/schedule/schedule.h"
#include "tests/daemons/local_cluster.h"
#include "tests/daemons/recovery_fixture.h"

namespace pipetrain::test::recovery_test {
namespace {

// A job hit by one fault (`fault` applied to the worker running `rank` once the job has
// committed a checkpoint and run past it) finishes by itself with one restart and the
// parameters of the run without faults, from the survivors' step where it has one.
void OneFaultTheJobFinishesByItself(const fs::path& dir, int workers, const char* what,
                                    const std::function<void(LocalCluster&, int)>& fault,
                                    const std::function<void(LocalCluster&, int)>& after,
                                    const std::string& schedule = "1f1b") {
  const absl::StatusOr<schedule::ScheduleKind> kind = schedule::ParseScheduleKind(schedule);
  ASSERT_TRUE(kind.ok()) << kind.status();
  const bool stashed = schedule::WeightsOf(*kind) == schedule::WeightPolicy::kStashed;
  LocalCluster cluster(dir, workers);
  ASSERT_FALSE(cluster.address().empty());
  ASSERT_TRUE(cluster.WaitForIdleWorkers(workers));
  const std::string body = Job(240, schedule);
  const fs::path weights = dir / "weights";
  std::ofstream(dir / "job.yaml") << WithRecovery(body, dir / "ckpt", 20, 1)
                                  << "weights_dir: " << weights.string() << "\n";
  auto stub = cluster.JobStub();
  const std::string id = Submit(cluster, dir / "job.yaml");
  v1::Job running = PollJob(
      *stub, id,
      [](const v1::Job& j) {
        return Ended(j) || (j.checkpoint_step() >= 40 && j.step() >= j.checkpoint_step() + 3);
      },
      milliseconds(120000));
  ASSERT_EQ(running.state(), v1::JOB_STATE_RUNNING) << running.DebugString();
  // The worker of stage 1 of replica 0 (rank 1), mid-step.
  const std::string victim = running.stage_status(1).worker_id();
  const int index = WorkerIndex(cluster, victim);
  ASSERT_GE(index, 0) << victim;
  const int64_t hit_unix_ms =
      std::chrono::duration_cast<milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  fault(cluster, index);
  const auto hit = Clock::now();
  v1::Job done = PollJob(*stub, id, Ended, milliseconds(180000));
  const double recovered_s = std::chrono::duration<double>(Clock::now() - hit).count();
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED)
      << what << ": " << done.DebugString() << ReadFile(cluster.coordinator_log());
  EXPECT_EQ(done.restarts(), 1);
  EXPECT_EQ(done.generation(), 2);
  EXPECT_EQ(done.step(), 239);
  ASSERT_EQ(done.recoveries_size(), 1);
  const v1::Recovery& r = done.recoveries(0);
  EXPECT_THAT(r.cause(), HasSubstr(victim));
  EXPECT_GE(r.resumed_at_step(), 40);
  EXPECT_LE(r.failed_after_step() + 1 - r.resumed_at_step(), 20 + 2)
      << "steps lost beyond the checkpoint interval";
  EXPECT_GT(r.first_step_unix_ms(), r.placed_unix_ms());
  // With replicas and a restart left the generation commits its steps, and the surviving
  // replica of the lost rank's place carries the job on (tests/daemons/survivors_test.cc);
  // stashed weights' updates (pipedream) cannot be committed: it restarts from the checkpoint.
  EXPECT_EQ(r.from_survivors(), !stashed) << ReadFile(cluster.coordinator_log());
  std::printf(
      "%s: finished %.1f s after the fault (restarted from %s); detected after %lld "
      "ms, then placed after %lld ms, first good step after %lld ms; layout %d x %d "
      "x %d\n",
      what, recovered_s, r.from_survivors() ? "the survivors" : "the checkpoint",
      static_cast<long long>(r.detected_unix_ms() - hit_unix_ms),
      static_cast<long long>(r.placed_unix_ms() - r.detected_unix_ms()),
      static_cast<long long>(r.first_step_unix_ms() - r.detected_unix_ms()), r.stages(),
      r.replicas(), r.microbatches());
  ExpectEveryStepOnceInIncreasingGenerations(CommittedSteps(dir / "jobs.db", id), 240, 2);
  // With stashed weights a checkpoint's flush changes which versions the next step's
  // micro-batches run on (section 4.3a of docs/design.md): the reference checkpoints at the
  // same steps.
  const std::string reference = stashed ? WithRecovery(body, dir / "reference-ckpt", 20, 1) : body;
  ExpectWithin(GatherWeights(weights, done.stages()), Uninterrupted(cluster, dir, reference),
               1e-10);
  Result logs = cluster.Cli("logs " + id);
  EXPECT_THAT(logs.out, HasSubstr("generation 1 ended: " + victim));
  EXPECT_THAT(logs.out, HasSubstr("generation 2 running"));
  // `pipetrain status` says what happened.
  Result status = cluster.Cli("status " + id);
  EXPECT_THAT(status.out, HasSubstr("generation 2  restarts 1/1  checkpoint before step "));
  EXPECT_THAT(status.out, HasSubstr("restart to generation 2: " + victim));
  EXPECT_THAT(status.out, HasSubstr("first good step"));
  after(cluster, index);
}

// SIGKILL mid-step under every kind of schedule (the one list: 2 stages, or 2 ranks of the
// kind's default chunks, each with its own checkpoint per model stage); a fifth worker is
// idle, so generation 2 runs the same layout at once. The killed worker, started again,
// rejoins the pool. Under 2BW the checkpoints hold W(N-1), which step N runs on, so the
// restarted generation continues the 1-step-stale trajectory and the job ends within 1e-10 of
// the uninterrupted job without any checkpoint; under PipeDream's weight stashing (no flush
// but at the checkpoints) the restarted generation resumes at one, the versions in flight
// rebuilt from the pipeline's start.
class WorkerKilledTest : public RecoveryTest,
                         public ::testing::WithParamInterface<schedule::ScheduleKind> {};

TEST_P(WorkerKilledTest, TheJobFinishesByItselfAsIfUninterrupted) {
  const std::string schedule(schedule::ScheduleKindName(GetParam()));
  OneFaultTheJobFinishesByItself(
      dir_, 5, ("SIGKILL under " + schedule).c_str(),
      [](LocalCluster& c, int w) { c.KillWorker(w); },
      [](LocalCluster& c, int) {
        c.StartWorker();
        EXPECT_TRUE(c.WaitForIdleWorkers(5));
      },
      schedule);
}

INSTANTIATE_TEST_SUITE_P(Schedules, WorkerKilledTest, ::testing::ValuesIn(schedule::kScheduleKinds),
                         [](const ::testing::TestParamInfo<schedule::ScheduleKind>& info) {
                           return std::string(schedule::ScheduleKindName(info.param));
                         });

// SIGSTOP (hung: no heartbeat, no progress) with no spare worker: the 3 that remain run
// 2 stages x 1 replica x 8 micro-batches (the same global batch). Continued, the stopped
// worker finds itself forgotten, stops its stale stage and registers again.
TEST_F(RecoveryTest, AWorkerHungTheJobGoesOnWithFewerReplicasAndTheWorkerRejoins) {
  OneFaultTheJobFinishesByItself(
      dir_, 4, "SIGSTOP", [](LocalCluster& c, int w) { kill(c.worker_pid(w), SIGSTOP); },
      [](LocalCluster& c, int w) {
        kill(c.worker_pid(w), SIGCONT);
        EXPECT_TRUE(c.WaitForIdleWorkers(4));  // no stage left behind on any worker
      });
}

// The coordinator SIGKILLed mid-job and started again: the job resumes from its checkpoint
// on the workers that register again, and succeeds.
TEST_F(RecoveryTest, ACoordinatorKilledMidJobResumesItsJobFromTheCheckpoint) {
  LocalCluster cluster(dir_, 4);
  ASSERT_FALSE(cluster.address().empty());
  ASSERT_TRUE(cluster.WaitForIdleWorkers(4));
  const std::string body = Job(200);
  const fs::path weights = dir_ / "weights";
  std::ofstream(dir_ / "job.yaml")
      << WithRecovery(body, dir_ / "ckpt", 20, 1) << "weights_dir: " << weights.string() << "\n";
  const std::string id = Submit(cluster, dir_ / "job.yaml");
  {
    auto stub = cluster.JobStub();
    v1::Job running = PollJob(
        *stub, id, [](const v1::Job& j) { return Ended(j) || j.checkpoint_step() >= 40; },
        milliseconds(120000));
    ASSERT_EQ(running.state(), v1::JOB_STATE_RUNNING) << running.DebugString();
    // The checkpoint is durable in the job's record once the coordinator has said so.
    std::this_thread::sleep_for(milliseconds(300));
  }
  cluster.KillCoordinator();
  ASSERT_TRUE(cluster.StartCoordinator(cluster.port()));
  auto stub = cluster.JobStub();
  v1::Job done = PollJob(*stub, id, Ended, milliseconds(180000));
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED)
      << done.DebugString() << ReadFile(cluster.coordinator_log());
  EXPECT_EQ(done.restarts(), 1);
  ASSERT_EQ(done.recoveries_size(), 1);
  EXPECT_THAT(done.recoveries(0).cause(), HasSubstr("the coordinator restarted"));
  EXPECT_GE(done.recoveries(0).resumed_at_step(), 40);
  ExpectEveryStepOnceInIncreasingGenerations(CommittedSteps(dir_ / "jobs.db", id), 200, 2);
  ExpectWithin(GatherWeights(weights, 2), Uninterrupted(cluster, dir_, body), 1e-10);
  EXPECT_TRUE(cluster.WaitForIdleWorkers(4));
}

// SIGTERM to a worker of the job (a preemption): the job is checkpointed at its earliest
// boundary, then restarts from that checkpoint on the other workers (a spare keeps the
// layout); the worker exits 0 once its stage is stopped; few steps are run again.
TEST_F(RecoveryTest, AWorkerStoppedWithSigtermCheckpointsTheJobFirst) {
  LocalCluster cluster(dir_, 5);
  ASSERT_FALSE(cluster.address().empty());
  ASSERT_TRUE(cluster.WaitForIdleWorkers(5));
  const std::string body = Job(200);
  const fs::path weights = dir_ / "weights";
  // No checkpoint policy: the only checkpoint is the one the drain asks for.
  std::ofstream(dir_ / "job.yaml")
      << WithRecovery(body, dir_ / "ckpt", 0, 1) << "weights_dir: " << weights.string() << "\n";
  auto stub = cluster.JobStub();
  const std::string id = Submit(cluster, dir_ / "job.yaml");
  v1::Job running = PollJob(
      *stub, id, [](const v1::Job& j) { return Ended(j) || j.step() >= 30; }, milliseconds(120000));
  ASSERT_EQ(running.state(), v1::JOB_STATE_RUNNING) << running.DebugString();
  const std::string victim = running.stage_status(1).worker_id();
  const int index = WorkerIndex(cluster, victim);
  ASSERT_GE(index, 0);
  const auto t0 = Clock::now();
  EXPECT_EQ(cluster.StopWorker(index), 0);
  const double stop_s = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_LT(stop_s, 30) << "the drain waits for one checkpoint, not for its deadline";
  v1::Job done = PollJob(*stub, id, Ended, milliseconds(180000));
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED)
      << done.DebugString() << ReadFile(cluster.coordinator_log());
  EXPECT_EQ(done.restarts(), 1);
  ASSERT_EQ(done.recoveries_size(), 1);
  const v1::Recovery& r = done.recoveries(0);
  EXPECT_THAT(r.cause(), HasSubstr(victim));
  EXPECT_THAT(r.cause(), HasSubstr("was stopped (drained) after the checkpoint before step"));
  EXPECT_GE(r.resumed_at_step(), 30);
  EXPECT_LE(r.failed_after_step() + 1 - r.resumed_at_step(), 3) << "steps run again";
  ExpectEveryStepOnceInIncreasingGenerations(CommittedSteps(dir_ / "jobs.db", id), 200, 2);
  ExpectWithin(GatherWeights(weights, 2), Uninterrupted(cluster, dir_, body), 1e-10);
  std::printf("worker drained and exited in %.2f s; %lld steps run again\n", stop_s,
              static_cast<long long>(r.failed_after_step() + 1 - r.resumed_at_step()));
}

// SIGTERM to the coordinator: its running job is checkpointed first; started again, the
// coordinator resumes the job from that checkpoint (few steps run again) and it succeeds.
TEST_F(RecoveryTest, ACoordinatorStoppedWithSigtermCheckpointsItsJobsFirst) {
  LocalCluster cluster(dir_, 4);
  ASSERT_FALSE(cluster.address().empty());
  ASSERT_TRUE(cluster.WaitForIdleWorkers(4));
  const std::string body = Job(200);
  const fs::path weights = dir_ / "weights";
  std::ofstream(dir_ / "job.yaml")
      << WithRecovery(body, dir_ / "ckpt", 0, 1) << "weights_dir: " << weights.string() << "\n";
  const std::string id = Submit(cluster, dir_ / "job.yaml");
  {
    auto stub = cluster.JobStub();
    v1::Job running = PollJob(
        *stub, id, [](const v1::Job& j) { return Ended(j) || j.step() >= 30; },
        milliseconds(120000));
    ASSERT_EQ(running.state(), v1::JOB_STATE_RUNNING) << running.DebugString();
  }
  EXPECT_EQ(cluster.StopCoordinator(), 0);
  EXPECT_THAT(ReadFile(cluster.coordinator_log()), HasSubstr("1 running job checkpointed"));
  ASSERT_TRUE(cluster.StartCoordinator(cluster.port()));
  auto stub = cluster.JobStub();
  v1::Job done = PollJob(*stub, id, Ended, milliseconds(180000));
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED)
      << done.DebugString() << ReadFile(cluster.coordinator_log());
  ASSERT_EQ(done.recoveries_size(), 1);
  const v1::Recovery& r = done.recoveries(0);
  EXPECT_THAT(r.cause(), HasSubstr("the coordinator restarted"));
  EXPECT_GE(r.resumed_at_step(), 30);
  EXPECT_LE(r.failed_after_step() + 1 - r.resumed_at_step(), 3) << "steps run again";
  ExpectEveryStepOnceInIncreasingGenerations(CommittedSteps(dir_ / "jobs.db", id), 200, 2);
  ExpectWithin(GatherWeights(weights, 2), Uninterrupted(cluster, dir_, body), 1e-10);
}

// /proc/PID: resident memory (bytes) and open file descriptors.
std::pair<int64_t, int> MemoryAndFds(pid_t pid) {
  int64_t rss = 0;
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) rss = std::stoll(line.substr(6)) * 1024;
  }
  int fds = 0;
  for ([[maybe_unused]] const auto& e :
       fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd")) {
    ++fds;
  }
  return {rss, fds};
}

// 25 times: a worker of the running job is SIGKILLed mid-step and a new one joins. The job
// succeeds; every step is committed once, generations only increase, and the coordinator's
// memory and open descriptors after the 25th cycle are close to those after the first.
TEST_F(RecoveryTest, TwentyFiveKillRejoinCyclesDuringOneJob) {
  constexpr int kCycles = 25;
  LocalCluster cluster(dir_, 4);
  ASSERT_FALSE(cluster.address().empty());
  ASSERT_TRUE(cluster.WaitForIdleWorkers(4));
  std::ofstream(dir_ / "job.yaml") << WithRecovery(Job(1000000), dir_ / "ckpt", 10, kCycles);
  auto stub = cluster.JobStub();
  const std::string id = Submit(cluster, dir_ / "job.yaml");
  std::mt19937 random(7);
  std::pair<int64_t, int> first{0, 0};
  for (int cycle = 1; cycle <= kCycles; ++cycle) {
    SCOPED_TRACE("cycle " + std::to_string(cycle));
    // Running generation `cycle`, past a checkpoint.
    v1::Job running = PollJob(
        *stub, id,
        [cycle](const v1::Job& j) {
          return Ended(j) || (j.generation() == cycle && j.stage_status_size() > 0 &&
                              j.checkpoint_step() > 0 && j.step() >= j.checkpoint_step() + 2);
        },
        milliseconds(60000));
    ASSERT_EQ(running.state(), v1::JOB_STATE_RUNNING) << running.DebugString();
    ASSERT_EQ(running.generation(), cycle) << running.DebugString();
    if (cycle == 1) first = MemoryAndFds(cluster.coordinator_pid());
    const v1::StageStatus& st =
        running.stage_status(static_cast<int>(random() % running.stage_status_size()));
    const int index = WorkerIndex(cluster, st.worker_id());
    ASSERT_GE(index, 0) << st.worker_id();
    ASSERT_TRUE(cluster.worker_running(index)) << st.worker_id();
    cluster.KillWorker(index);
    cluster.StartWorker();
  }
  v1::Job last = PollJob(
      *stub, id,
      [](const v1::Job& j) {
        return Ended(j) || (j.generation() == kCycles + 1 && j.step() >= j.checkpoint_step() + 2 &&
                            j.checkpoint_step() > 0);
      },
      milliseconds(60000));
  ASSERT_EQ(last.generation(), kCycles + 1) << last.DebugString();
  const std::pair<int64_t, int> after = MemoryAndFds(cluster.coordinator_pid());
  Result stop = cluster.Cli("stop " + id);
  ASSERT_EQ(stop.exit_code, 0) << stop.err;
  v1::Job done = PollJob(*stub, id, Ended, milliseconds(60000));
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.DebugString();
  EXPECT_EQ(done.restarts(), kCycles);
  EXPECT_EQ(done.recoveries_size(), kCycles);
  for (int i = 0; i < done.recoveries_size(); ++i) {
    EXPECT_EQ(done.recoveries(i).generation(), i + 2);
  }
  ExpectEveryStepOnceInIncreasingGenerations(CommittedSteps(dir_ / "jobs.db", id), done.step() + 1,
                                             kCycles + 1);
  std::printf("coordinator after cycle 1: %lld KiB, %d fds; after cycle %d: %lld KiB, %d fds\n",
              static_cast<long long>(first.first / 1024), first.second, kCycles,
              static_cast<long long>(after.first / 1024), after.second);
  EXPECT_LE(after.first, first.first + (int64_t{16} << 20));
  EXPECT_LE(after.second, first.second + 8);
}

}  // namespace
}  // namespace pipetrain::test::recovery_test
