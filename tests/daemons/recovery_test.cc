// Automatic recovery with real daemons on loopback (local_cluster.h): a worker SIGKILLed
// mid-step, another SIGSTOPped (hung), the coordinator SIGKILLed and restarted, and 25
// kill/rejoin cycles during one job. Each time the job finishes by itself, restarted from its
// latest checkpoint, and its final parameters equal a run without faults (float64, 1e-10:
// the data order and the arithmetic do not depend on the layout). The steps the coordinator
// committed are read from its SQLite file: every step exactly once, generations increasing.
#include <signal.h>
#include <sqlite3.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "pipetrain/v1/job_service.grpc.pb.h"
#include "tests/daemons/local_cluster.h"

namespace {

namespace fs = std::filesystem;
namespace v1 = ::pipetrain::v1;
using ::pipetrain::test::GetJob;
using ::pipetrain::test::LocalCluster;
using ::pipetrain::test::ReadFile;
using ::pipetrain::test::Result;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

class RecoveryTest : public ::pipetrain::test::DaemonTest {};

// p = 2, w = 2, float64: slow enough (a few hundred steps, several seconds) to be hit
// mid-step, with a checkpoint every `every` steps.
// The job without its checkpoint policy and max_restarts (see WithRecovery).
std::string Job(int steps) {
  return "model: {name: gpt, d_model: 32, n_heads: 4, n_layers: 2}\n"
         "schedule: 1f1b\nstages: 2\nreplicas: 2\nmicrobatches: 4\nmicrobatch_size: 4\n"
         "steps: " + std::to_string(steps) + "\ndtype: float64\n"
         "optimizer: {name: adamw, lr: 0.003}\ntimeout_s: 30\n";
}

std::string WithRecovery(const std::string& job, const fs::path& checkpoints, int every,
                         int max_restarts) {
  return job + "checkpoint: {dir: " + checkpoints.string() + ", every: " +
         std::to_string(every) + ", keep: 2}\nmax_restarts: " + std::to_string(max_restarts) +
         "\n";
}

// The number (start order) of the worker registered as `worker_id` (its log says so);
// -1 if none.
int WorkerIndex(LocalCluster& cluster, const std::string& worker_id) {
  for (int i = 0; i < cluster.workers_started(); ++i) {
    if (ReadFile(cluster.worker_log(i)).find("registered as " + worker_id + " ") !=
        std::string::npos) {
      return i;
    }
  }
  return -1;
}

v1::Job PollJob(v1::JobService::Stub& stub, const std::string& id,
                const std::function<bool(const v1::Job&)>& done, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  v1::Job job;
  while (Clock::now() < deadline) {
    job = GetJob(stub, id);
    if (done(job)) break;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return job;
}

bool Ended(const v1::Job& job) {
  return job.state() == v1::JOB_STATE_SUCCEEDED || job.state() == v1::JOB_STATE_FAILED ||
         job.state() == v1::JOB_STATE_CANCELLED;
}

// The steps the coordinator committed for `job_id`: step -> generation, read from its store.
std::map<int64_t, int> CommittedSteps(const fs::path& db, const std::string& job_id) {
  std::map<int64_t, int> steps;
  sqlite3* handle = nullptr;
  if (sqlite3_open_v2(db.c_str(), &handle, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    ADD_FAILURE() << "cannot open " << db;
    sqlite3_close(handle);
    return steps;
  }
  sqlite3_busy_timeout(handle, 5000);
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(handle, "SELECT step, generation FROM steps WHERE job_id = ?1", -1, &st,
                     nullptr);
  sqlite3_bind_blob(st, 1, job_id.data(), static_cast<int>(job_id.size()), SQLITE_TRANSIENT);
  while (sqlite3_step(st) == SQLITE_ROW) {
    const auto [it, fresh] = steps.emplace(sqlite3_column_int64(st, 0),
                                           static_cast<int>(sqlite3_column_int64(st, 1)));
    EXPECT_TRUE(fresh) << "step " << it->first << " committed twice";
  }
  sqlite3_finalize(st);
  sqlite3_close(handle);
  return steps;
}

// Every step 0..steps-1 committed once, by generations that only increase with the step.
void ExpectEveryStepOnceInIncreasingGenerations(const std::map<int64_t, int>& steps,
                                                int64_t count, int last_generation) {
  ASSERT_EQ(static_cast<int64_t>(steps.size()), count);
  EXPECT_EQ(steps.begin()->first, 0);
  EXPECT_EQ(steps.rbegin()->first, count - 1);
  int previous = 1;
  for (const auto& [step, generation] : steps) {
    EXPECT_GE(generation, previous) << "step " << step;
    previous = generation;
  }
  EXPECT_EQ(previous, last_generation);
}

// Parameters then buffers of replica 0's stages (ranks 0..stages-1) from weights_dir.
std::vector<at::Tensor> GatherWeights(const fs::path& dir, int stages) {
  std::vector<at::Tensor> params, buffers;
  for (int rank = 0; rank < stages; ++rank) {
    std::vector<at::Tensor> stage;
    torch::load(stage, (dir / ("stage" + std::to_string(rank) + ".pt")).string());
    const auto meta =
        nlohmann::json::parse(ReadFile(dir / ("stage" + std::to_string(rank) + ".json")));
    const size_t n = meta.at("num_parameters");
    params.insert(params.end(), stage.begin(), stage.begin() + n);
    buffers.insert(buffers.end(), stage.begin() + n, stage.end());
  }
  params.insert(params.end(), buffers.begin(), buffers.end());
  return params;
}

// The same job run without daemons and without faults (stages as threads).
std::vector<at::Tensor> Uninterrupted(LocalCluster& cluster, const fs::path& dir,
                                      const std::string& spec) {
  std::ofstream(dir / "reference.yaml") << spec;
  Result ran = cluster.Shell(std::string(LocalCluster::cli_path()) + " run --launch threads " +
                             (dir / "reference.yaml").string() + " -q --save-weights " +
                             (dir / "reference.pt").string());
  EXPECT_EQ(ran.exit_code, 0) << ran.err;
  std::vector<at::Tensor> expected;
  torch::load(expected, (dir / "reference.pt").string());
  return expected;
}

void ExpectWithin(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& expected,
                  double tolerance) {
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].sizes(), expected[i].sizes()) << i;
    const double denom = std::max(expected[i].norm().item<double>(), 1e-30);
    EXPECT_LE((got[i] - expected[i]).norm().item<double>() / denom, tolerance) << "tensor " << i;
  }
}

std::string Submit(LocalCluster& cluster, const fs::path& spec) {
  Result submitted = cluster.Cli("submit " + spec.string());
  EXPECT_EQ(submitted.exit_code, 0) << submitted.err;
  return "job-0001";
}

// A job hit by one fault (`fault` applied to the worker running `rank` once the job has
// committed a checkpoint and run past it) finishes by itself with one restart and the
// parameters of the run without faults.
void OneFaultTheJobFinishesByItself(const fs::path& dir, int workers, const char* what,
                                    const std::function<void(LocalCluster&, int)>& fault,
                                    const std::function<void(LocalCluster&, int)>& after) {
  LocalCluster cluster(dir, workers);
  ASSERT_FALSE(cluster.address().empty());
  ASSERT_TRUE(cluster.WaitForIdleWorkers(workers));
  const std::string body = Job(240);
  const fs::path weights = dir / "weights";
  std::ofstream(dir / "job.yaml") << WithRecovery(body, dir / "ckpt", 20, 1)
                                  << "weights_dir: " << weights.string() << "\n";
  auto stub = cluster.JobStub();
  const std::string id = Submit(cluster, dir / "job.yaml");
  v1::Job running = PollJob(*stub, id, [](const v1::Job& j) {
    return Ended(j) || (j.checkpoint_step() >= 40 && j.step() >= j.checkpoint_step() + 3);
  }, milliseconds(120000));
  ASSERT_EQ(running.state(), v1::JOB_STATE_RUNNING) << running.DebugString();
  // The worker of stage 1 of replica 0 (rank 1), mid-step.
  const std::string victim = running.stage_status(1).worker_id();
  const int index = WorkerIndex(cluster, victim);
  ASSERT_GE(index, 0) << victim;
  const int64_t hit_unix_ms = std::chrono::duration_cast<milliseconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
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
  std::printf("%s: finished %.1f s after the fault; detected after %lld ms, then placed "
              "after %lld ms, first good step after %lld ms; layout %d x %d x %d\n",
              what, recovered_s, static_cast<long long>(r.detected_unix_ms() - hit_unix_ms),
              static_cast<long long>(r.placed_unix_ms() - r.detected_unix_ms()),
              static_cast<long long>(r.first_step_unix_ms() - r.detected_unix_ms()), r.stages(),
              r.replicas(), r.microbatches());
  ExpectEveryStepOnceInIncreasingGenerations(CommittedSteps(dir / "jobs.db", id), 240, 2);
  ExpectWithin(GatherWeights(weights, done.stages()), Uninterrupted(cluster, dir, body), 1e-10);
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

// SIGKILL mid-step; a fifth worker is idle, so generation 2 runs the same layout at once.
// The killed worker, started again, rejoins the pool.
TEST_F(RecoveryTest, AWorkerKilledMidStepTheJobFinishesByItselfAsIfUninterrupted) {
  OneFaultTheJobFinishesByItself(
      dir_, 5, "SIGKILL", [](LocalCluster& c, int w) { c.KillWorker(w); },
      [](LocalCluster& c, int) {
        c.StartWorker();
        EXPECT_TRUE(c.WaitForIdleWorkers(5));
      });
}

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
  std::ofstream(dir_ / "job.yaml") << WithRecovery(body, dir_ / "ckpt", 20, 1)
                                   << "weights_dir: " << weights.string() << "\n";
  const std::string id = Submit(cluster, dir_ / "job.yaml");
  {
    auto stub = cluster.JobStub();
    v1::Job running = PollJob(*stub, id, [](const v1::Job& j) {
      return Ended(j) || j.checkpoint_step() >= 40;
    }, milliseconds(120000));
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
  std::ofstream(dir_ / "job.yaml") << WithRecovery(body, dir_ / "ckpt", 0, 1)
                                   << "weights_dir: " << weights.string() << "\n";
  auto stub = cluster.JobStub();
  const std::string id = Submit(cluster, dir_ / "job.yaml");
  v1::Job running = PollJob(*stub, id, [](const v1::Job& j) {
    return Ended(j) || j.step() >= 30;
  }, milliseconds(120000));
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
  std::ofstream(dir_ / "job.yaml") << WithRecovery(body, dir_ / "ckpt", 0, 1)
                                   << "weights_dir: " << weights.string() << "\n";
  const std::string id = Submit(cluster, dir_ / "job.yaml");
  {
    auto stub = cluster.JobStub();
    v1::Job running = PollJob(*stub, id, [](const v1::Job& j) {
      return Ended(j) || j.step() >= 30;
    }, milliseconds(120000));
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

// A checkpoint that cannot be written (its directory is a file here; a full disk behaves the
// same) is reported in the job's events; the job goes on and succeeds, its restart point
// unchanged.
TEST_F(RecoveryTest, AFailedCheckpointIsReportedAndTheJobGoesOn) {
  LocalCluster cluster(dir_, 2);
  ASSERT_FALSE(cluster.address().empty());
  ASSERT_TRUE(cluster.WaitForIdleWorkers(2));
  std::ofstream(dir_ / "not-a-directory") << "x";
  std::ofstream(dir_ / "job.yaml")
      << "model: {name: gpt, d_model: 16, n_heads: 2, n_layers: 2}\nstages: 2\nsteps: 12\n"
      << "checkpoint: {dir: " << (dir_ / "not-a-directory" / "ckpt").string() << ", every: 5}\n";
  Result done = cluster.Cli("submit " + (dir_ / "job.yaml").string() + " --follow");
  EXPECT_EQ(done.exit_code, 0) << done.err;
  Result logs = cluster.Cli("logs job-0001");
  EXPECT_THAT(logs.out, HasSubstr("checkpoint before step 5 failed on stage"));
  EXPECT_THAT(logs.out, HasSubstr("the job goes on; its restart point stays at step 0"));
  EXPECT_THAT(logs.out, HasSubstr("checkpoint before step 10 failed on stage"));
  EXPECT_EQ(GetJob(*cluster.JobStub(), "job-0001").checkpoint_step(), 0);
}

// A small job of 2 stages: what the checkpoint tests below run and resume (their steps,
// checkpoint and resume_from appended).
constexpr char kSmallJob[] = "model: {name: gpt, d_model: 16, n_heads: 2, n_layers: 2}\n"
                             "stages: 2\noptimizer: {name: sgd, lr: 0.05}\n";

// Runs kSmallJob for `steps` steps with a checkpoint every `every` in `ckpt` (its file
// written to `file`); whether it succeeded.
bool RunSmallJobWithCheckpoints(LocalCluster& cluster, const fs::path& file,
                                const fs::path& ckpt, int steps, int every) {
  std::ofstream(file) << kSmallJob << "steps: " << steps << "\ncheckpoint: {dir: "
                      << ckpt.string() << ", every: " << every << "}\n";
  Result done = cluster.Cli("submit " + file.string() + " --follow");
  EXPECT_EQ(done.exit_code, 0) << done.err;
  return done.exit_code == 0;
}

// A job resuming from a directory whose newest checkpoint is corrupt resumes from the one
// before it, and says so where its user looks: an event and its status name the checkpoint
// passed over and why (this was once only in a worker's stderr: the job silently ran steps
// again). The same job also shows a checkpoint directory is free again once its job ended.
TEST_F(RecoveryTest, ACorruptNewestCheckpointPassedOverIsInTheEventsAndTheStatus) {
  LocalCluster cluster(dir_, 2);
  ASSERT_FALSE(cluster.address().empty());
  ASSERT_TRUE(cluster.WaitForIdleWorkers(2));
  const fs::path ckpt = dir_ / "ckpt";
  ASSERT_TRUE(RunSmallJobWithCheckpoints(cluster, dir_ / "first.yaml", ckpt, 9, 4));
  const std::string job = kSmallJob;
  ASSERT_TRUE(fs::exists(ckpt / "step-00000008"));
  ASSERT_TRUE(fs::exists(ckpt / "step-00000004"));
  const fs::path layer = ckpt / "step-00000008" / "layer-00001.pt";
  std::fstream f(layer, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(40);
  f.put('\x7f');
  f.close();
  std::ofstream(dir_ / "second.yaml")
      << job << "steps: 12\nresume_from: latest\ncheckpoint: {dir: " << ckpt.string() << "}\n";
  Result second = cluster.Cli("submit " + (dir_ / "second.yaml").string() + " --follow");
  ASSERT_EQ(second.exit_code, 0) << second.err;
  const v1::Job resumed = GetJob(*cluster.JobStub(), "job-0002");
  EXPECT_EQ(resumed.resumed_from(), (ckpt / "step-00000004").string());
  ASSERT_EQ(resumed.checkpoints_passed_over_size(), 1);
  EXPECT_THAT(resumed.checkpoints_passed_over(0), HasSubstr("step-00000008"));
  EXPECT_THAT(resumed.checkpoints_passed_over(0), HasSubstr("SHA-256"));
  Result logs = cluster.Cli("logs job-0002");
  EXPECT_THAT(logs.out, HasSubstr("resuming: passed over"));
  EXPECT_THAT(logs.out, HasSubstr("resumed from " + (ckpt / "step-00000004").string()));
  Result status = cluster.Cli("status job-0002");
  EXPECT_THAT(status.out, HasSubstr("passed over"));
}

// A checkpoint layer whose bytes match its manifest but cannot be unpickled fails its rank
// after the ranks have joined, and the peer then fails on its closed connection. The job's
// message is the layer's error, the first real cause (it was once the peer's "Connection
// closed by peer", the real cause only in a worker's stderr).
TEST_F(RecoveryTest, AnUnreadableLayerIsTheJobsCauseNotThePeersClosedConnection) {
  LocalCluster cluster(dir_, 2);
  ASSERT_FALSE(cluster.address().empty());
  ASSERT_TRUE(cluster.WaitForIdleWorkers(2));
  const fs::path ckpt = dir_ / "ckpt";
  ASSERT_TRUE(RunSmallJobWithCheckpoints(cluster, dir_ / "first.yaml", ckpt, 5, 4));
  const std::string job = kSmallJob;
  const fs::path step = ckpt / "step-00000004";
  const std::string garbage(64, 'z');
  std::ofstream(step / "layer-00003.pt", std::ios::binary | std::ios::trunc) << garbage;
  Result sha = cluster.Shell("sha256sum " + (step / "layer-00003.pt").string());
  ASSERT_EQ(sha.exit_code, 0);
  nlohmann::json manifest = nlohmann::json::parse(ReadFile(step / "manifest.json"));
  for (auto& f : manifest["files"]) {
    if (f["layer"] == 3) {
      f["bytes"] = garbage.size();
      f["sha256"] = sha.out.substr(0, 64);
    }
  }
  std::ofstream(step / "manifest.json", std::ios::trunc) << manifest.dump();
  std::ofstream(dir_ / "second.yaml") << job << "steps: 8\nresume_from: " << step.string() << "\n";
  Result second = cluster.Cli("submit " + (dir_ / "second.yaml").string() + " --follow");
  EXPECT_EQ(second.exit_code, 1) << second.out << second.err;
  const v1::Job failed = GetJob(*cluster.JobStub(), "job-0002");
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.message(), HasSubstr("layer-00003.pt")) << failed.message();
  EXPECT_THAT(failed.message(), ::testing::Not(HasSubstr("closed by peer"))) << failed.message();
  EXPECT_TRUE(cluster.WaitForIdleWorkers(2, std::chrono::seconds(10)));
}

// /proc/PID: resident memory (bytes) and open file descriptors.
std::pair<int64_t, int> MemoryAndFds(pid_t pid) {
  int64_t rss = 0;
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) rss = std::stoll(line.substr(6)) * 1024;
  }
  int fds = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd")) {
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
    v1::Job running = PollJob(*stub, id, [cycle](const v1::Job& j) {
      return Ended(j) || (j.generation() == cycle && j.stage_status_size() > 0 &&
                          j.checkpoint_step() > 0 && j.step() >= j.checkpoint_step() + 2);
    }, milliseconds(60000));
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
  v1::Job last = PollJob(*stub, id, [](const v1::Job& j) {
    return Ended(j) || (j.generation() == kCycles + 1 && j.step() >= j.checkpoint_step() + 2 &&
                        j.checkpoint_step() > 0);
  }, milliseconds(60000));
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
  ExpectEveryStepOnceInIncreasingGenerations(CommittedSteps(dir_ / "jobs.db", id),
                                             done.step() + 1, kCycles + 1);
  std::printf("coordinator after cycle 1: %lld KiB, %d fds; after cycle %d: %lld KiB, %d fds\n",
              static_cast<long long>(first.first / 1024), first.second, kCycles,
              static_cast<long long>(after.first / 1024), after.second);
  EXPECT_LE(after.first, first.first + (int64_t{16} << 20));
  EXPECT_LE(after.second, first.second + 8);
}

}  // namespace
