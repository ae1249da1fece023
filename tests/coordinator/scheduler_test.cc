// The scheduler's decisions, case by case: a recovering job's next generation (its own layout,
// a smaller one after the grace, workers whose memory is too small, old ranks still ending,
// out of time), an assignment's retry, the queue over the registry's view, and ranks on
// hosts by the job's traffic (against the model's formulas and an in-order control). No
// coordinator, no clock, no sockets: the inputs are values and so are the answers.
#include "coordinator/scheduler.h"

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "coordinator/job_traffic.h"

namespace pipetrain::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

const absl::Time kT0 = absl::FromUnixSeconds(1700000000);
const absl::Duration kBeat = absl::Seconds(1);

v1::WorkerInfo Worker(const std::string& id, v1::WorkerState state, const std::string& job = "",
                      int64_t memory = 0, const std::string& device = "cpu") {
  v1::WorkerInfo w;
  w.set_id(id);
  w.set_state(state);
  w.set_job_id(job);
  w.set_memory_bytes(memory);
  w.set_device(device);
  return w;
}

std::vector<v1::WorkerInfo> Idle(int n, int64_t memory = 0) {
  std::vector<v1::WorkerInfo> out;
  for (int i = 1; i <= n; ++i) {
    out.push_back(Worker("worker-" + std::to_string(i), v1::WORKER_STATE_IDLE, "", memory));
  }
  return out;
}

// A 2-stage x 2-replica job (4 micro-batches) whose generation 1 a fault ended at kT0.
struct Recovering {
  Recovering() {
    v1::JobSpec& s = *job.mutable_spec();
    s.mutable_model()->set_name("gpt");
    s.mutable_model()->set_d_model(16);
    s.mutable_model()->set_n_heads(2);
    s.mutable_model()->set_n_layers(2);
    s.set_schedule("1f1b");
    s.set_stages(2);
    s.set_replicas(2);
    s.set_microbatches(4);
    s.set_microbatch_size(2);
    s.set_steps(10);
    s.set_timeout_s(30);
    s.set_max_restarts(2);
    job.set_id("job-0001");
    job.set_stages(2);
    job.set_replicas(2);
    job.set_steps(10);
    job.set_step(5);
    job.set_generation(1);
    job.set_restarts(1);
    job.add_recoveries()->set_cause("worker-9 lost");
  }
  RecoveringJob View() {
    config = *job::Validated(job.spec());
    return {&job, &config, kT0, lost_ranks_stop_by};
  }
  // What one rank of its own layout holds for its parameters (the scheduler's memory model).
  int64_t RankBytes() {
    View();
    return *RankParameterStateBytes(config, job::PipelineLayoutOf(config));
  }
  v1::Job job;
  job::JobSpec config;
  absl::Time lost_ranks_stop_by = absl::InfinitePast();
};

// stages x replicas x micro-batches
std::string Text(const model::PipelineLayout& l) {
  return std::to_string(l.stages) + "x" + std::to_string(l.replicas) + "x" +
         std::to_string(l.micro_batches);
}

RecoveryPlan Plan(Recovering& r, const std::vector<v1::WorkerInfo>& workers, absl::Duration after) {
  return Scheduler({kBeat, 3}).PlanRecovery(r.View(), workers, kT0 + after);
}

TEST(SchedulerRecovery, TheJobsOwnLayoutAsSoonAsItsWorkersAreIdleFromItsCheckpoint) {
  Recovering r;
  r.job.set_checkpoint_step(4);
  r.job.set_checkpoint_path("/ck/checkpoint-4");
  std::vector<v1::WorkerInfo> workers = Idle(5);
  const RecoveryPlan plan = Plan(r, workers, absl::ZeroDuration());
  const auto* start = std::get_if<StartGeneration>(&plan);
  ASSERT_NE(start, nullptr);
  EXPECT_EQ(Text(start->layout), "2x2x4");
  EXPECT_THAT(start->rank_workers, ElementsAre("worker-1", "worker-2", "worker-3", "worker-4"));
  EXPECT_EQ(start->start_step, 4);
  EXPECT_EQ(start->run_spec.resume_from(), "/ck/checkpoint-4");
  EXPECT_EQ(start->announcement, "");
}

TEST(SchedulerRecovery, WithoutACheckpointItStartsAgainFromTheStartOrTheSpecsResumePoint) {
  Recovering r;
  RecoveryPlan plan = Plan(r, Idle(4), absl::ZeroDuration());
  ASSERT_TRUE(std::holds_alternative<StartGeneration>(plan));
  EXPECT_EQ(std::get<StartGeneration>(plan).start_step, 0);
  EXPECT_FALSE(std::get<StartGeneration>(plan).run_spec.has_resume_from());
  r.job.mutable_spec()->set_resume_from("/old/run");
  plan = Plan(r, Idle(4), absl::ZeroDuration());
  ASSERT_TRUE(std::holds_alternative<StartGeneration>(plan));
  EXPECT_EQ(std::get<StartGeneration>(plan).start_step, -1);  // the spec's resume_from
}

TEST(SchedulerRecovery, OldRanksStillEndingHoldTheIdleWorkers) {
  Recovering r;
  std::vector<v1::WorkerInfo> workers = Idle(4);
  workers.push_back(Worker("worker-9", v1::WORKER_STATE_BUSY, "job-0001"));
  const RecoveryPlan plan = Plan(r, workers, absl::Seconds(10));
  const auto* wait = std::get_if<WaitForWorkers>(&plan);
  ASSERT_NE(wait, nullptr);
  EXPECT_TRUE(wait->holds_idle_workers);
  EXPECT_EQ(wait->why,
            "recovering (restart 1 of 2): worker-9 lost; waits for workers to restart on: 4 "
            "idle, ranks of the last generation still ending; up to timeout_s (30s) in all");
  // A worker busy with another job is not one of its ranks.
  workers.back().set_job_id("job-0002");
  EXPECT_TRUE(std::holds_alternative<StartGeneration>(Plan(r, workers, absl::Seconds(10))));
}

// A lost worker (silent: maybe only cut off from the coordinator) may run its rank until its
// lease ends: the next generation is not placed before, whatever is idle, and the idle
// workers are held for it meanwhile.
TEST(SchedulerRecovery, ALostWorkersLeaseEndsBeforeTheNextGenerationStarts) {
  Recovering r;
  r.lost_ranks_stop_by = kT0 + absl::Seconds(2);
  for (absl::Duration after : {absl::ZeroDuration(), absl::Milliseconds(1999)}) {
    const RecoveryPlan plan = Plan(r, Idle(5), after);
    const auto* wait = std::get_if<WaitForWorkers>(&plan);
    ASSERT_NE(wait, nullptr) << after;
    EXPECT_TRUE(wait->holds_idle_workers);
    EXPECT_EQ(wait->why,
              "recovering (restart 1 of 2): worker-9 lost; waits for workers to restart on: 5 "
              "idle, a lost worker's lease first (it may still run its rank until then); up "
              "to timeout_s (30s) in all");
  }
  EXPECT_TRUE(std::holds_alternative<StartGeneration>(Plan(r, Idle(5), absl::Seconds(2))));
}

TEST(SchedulerRecovery, FewerWorkersWaitForTheGraceThenASmallerLayoutWithTheSameBatch) {
  Recovering r;
  RecoveryPlan plan = Plan(r, Idle(3), 3 * kBeat - absl::Milliseconds(1));
  ASSERT_TRUE(std::holds_alternative<WaitForWorkers>(plan));
  EXPECT_TRUE(std::get<WaitForWorkers>(plan).holds_idle_workers);
  EXPECT_THAT(std::get<WaitForWorkers>(plan).why, HasSubstr("the same layout for 3 heartbeats"));

  plan = Plan(r, Idle(3), 3 * kBeat);
  const auto* start = std::get_if<StartGeneration>(&plan);
  ASSERT_NE(start, nullptr);
  // 2 stages x 1 replica x 8 micro-batches: replicas x micro-batches unchanged.
  EXPECT_EQ(Text(start->layout), "2x1x8");
  EXPECT_THAT(start->rank_workers, ElementsAre("worker-1", "worker-2"));
  EXPECT_EQ(start->run_spec.replicas(), 1);
  EXPECT_EQ(start->run_spec.microbatches(), 8);
  EXPECT_EQ(start->announcement,
            "only 3 workers: generation 2 runs 2 stages x 1 replicas x 8 micro-batches (the "
            "global batch unchanged)");
}

TEST(SchedulerRecovery, WorkersTooSmallForARanksWeightsAreNotUsed) {
  Recovering r;
  const int64_t need = r.RankBytes();
  // Three workers hold a rank, two do not: after the grace, the 2 x 1 layout on two of them.
  std::vector<v1::WorkerInfo> workers = Idle(5, need);
  workers[0].set_memory_bytes(need - 1);
  workers[2].set_memory_bytes(need - 1);
  RecoveryPlan plan = Plan(r, workers, 3 * kBeat);
  const auto* start = std::get_if<StartGeneration>(&plan);
  ASSERT_NE(start, nullptr);
  EXPECT_EQ(start->layout.replicas, 1);
  EXPECT_THAT(start->rank_workers, ElementsAre("worker-2", "worker-4"));
  // None holds one: it waits, says why, and holds no idle worker after the grace.
  plan = Plan(r, Idle(5, 1024), 3 * kBeat);
  const auto* wait = std::get_if<WaitForWorkers>(&plan);
  ASSERT_NE(wait, nullptr);
  EXPECT_FALSE(wait->holds_idle_workers);
  EXPECT_THAT(wait->why, HasSubstr("bytes for a rank's parameters, gradients and optimizer "
                                   "state, 0 idle have them"));
}

TEST(SchedulerRecovery, ARankHoldsItsWeightVersionsOptimizerStateAndGradient) {
  // AdamW (two moments) and one weight version (1F1B): 1 + 2 + 1 copies of the largest
  // stage's parameters; 2BW keeps a second version: 2 + 2 + 1.
  Recovering r;
  const int64_t one_f_one_b = r.RankBytes();
  r.job.mutable_spec()->set_schedule("2bw");
  const int64_t two_bw = r.RankBytes();
  ASSERT_GT(one_f_one_b, 0);
  EXPECT_EQ(one_f_one_b % 16, 0);  // 4 copies of float32 parameters
  EXPECT_EQ(two_bw * 4, one_f_one_b * 5);
  // Float64 doubles it.
  r.job.mutable_spec()->set_dtype("float64");
  EXPECT_EQ(r.RankBytes(), 2 * two_bw);
}

TEST(SchedulerRecovery, WorkersOfAnotherDeviceKindDoNotCount) {
  Recovering r;
  std::vector<v1::WorkerInfo> workers = Idle(2);
  for (int i = 0; i < 3; ++i) {
    workers.push_back(Worker("gpu-" + std::to_string(i), v1::WORKER_STATE_IDLE, "", 0,
                             "cuda:" + std::to_string(i)));
  }
  const RecoveryPlan plan = Plan(r, workers, absl::ZeroDuration());
  ASSERT_TRUE(std::holds_alternative<WaitForWorkers>(plan));
  EXPECT_THAT(std::get<WaitForWorkers>(plan).why, HasSubstr(": 2 idle"));
}

TEST(SchedulerRecovery, NoLayoutWithinTheTimeoutGivesUpSayingWhy) {
  Recovering r;
  EXPECT_TRUE(std::holds_alternative<WaitForWorkers>(Plan(r, {}, absl::Seconds(30))));
  const RecoveryPlan plan = Plan(r, {}, absl::Seconds(31));
  const auto* give_up = std::get_if<GiveUp>(&plan);
  ASSERT_NE(give_up, nullptr);
  EXPECT_EQ(give_up->message,
            "no workers to restart on within timeout_s (30s): 0 idle; it ran 6 of 10 steps; "
            "the last fault: worker-9 lost");
}

TEST(SchedulerRetry, AnUnreachableWorkersRankMovesWhileAttemptsAreLeft) {
  const Scheduler scheduler({kBeat, 3});
  const absl::Status unreachable = absl::UnavailableError("connection refused");
  RetryPlan plan = scheduler.PlanRetry(unreachable, 1, {"worker-5", "worker-6"});
  ASSERT_TRUE(std::holds_alternative<RetryOnWorker>(plan));
  EXPECT_EQ(std::get<RetryOnWorker>(plan).worker_id, "worker-5");
  EXPECT_TRUE(std::holds_alternative<RetryOnWorker>(
      scheduler.PlanRetry(absl::DeadlineExceededError("slow"), 2, {"worker-6"})));
  // The third failure in all, or no idle worker: back to the queue (no restart spent).
  EXPECT_TRUE(
      std::holds_alternative<NoWorkerForRank>(scheduler.PlanRetry(unreachable, 3, {"worker-6"})));
  EXPECT_TRUE(std::holds_alternative<NoWorkerForRank>(scheduler.PlanRetry(unreachable, 1, {})));
  // A worker that answered and refused: the job's fault, whatever is idle.
  EXPECT_TRUE(std::holds_alternative<RankRefused>(scheduler.PlanRetry(
      absl::FailedPreconditionError("busy with rank 0 of job-0002"), 1, {"worker-6"})));
}

TEST(SchedulerQueue, LostWorkersAreNeverPlacedAndBusyOnesOnlyCount) {
  const Scheduler scheduler({kBeat, 3});
  std::vector<v1::WorkerInfo> workers = {Worker("worker-1", v1::WORKER_STATE_LOST),
                                         Worker("worker-2", v1::WORKER_STATE_IDLE),
                                         Worker("worker-3", v1::WORKER_STATE_BUSY, "job-0001"),
                                         Worker("worker-4", v1::WORKER_STATE_IDLE)};
  PlacementPlan plan =
      scheduler.PlanQueue({{"job-0002", 2, 0, "cpu"}, {"job-0003", 2, 0, "cpu"}}, workers);
  ASSERT_EQ(plan.started.size(), 1u);
  EXPECT_THAT(plan.started[0].rank_workers, ElementsAre("worker-2", "worker-4"));
  ASSERT_EQ(plan.waiting.size(), 1u);
  EXPECT_EQ(plan.waiting[0].job_id, "job-0003");
  EXPECT_THAT(plan.waiting[0].reason, HasSubstr("needs 2 workers"));
  plan = scheduler.PlanQueue({{"job-0004", 4, 0, "cpu"}}, workers);
  EXPECT_THAT(plan.started, IsEmpty());
}

// ---- Hosts

v1::WorkerInfo OnHost(const std::string& id, const std::string& host) {
  v1::WorkerInfo w = Worker(id, v1::WORKER_STATE_IDLE);
  w.set_host(host);
  return w;
}

// Two hosts of two workers, registered host by host.
std::vector<v1::WorkerInfo> TwoHosts() {
  return {OnHost("a1", "host-a"), OnHost("a2", "host-a"), OnHost("b1", "host-b"),
          OnHost("b2", "host-b")};
}

// A 2-stage x 2-replica job of `model` (1f1b, 4 micro-batches of `b`).
job::JobSpec TwoByTwo(const std::string& model, int b) {
  v1::JobSpec s;
  s.mutable_model()->set_name(model);
  s.set_schedule("1f1b");
  s.set_stages(2);
  s.set_replicas(2);
  s.set_microbatches(4);
  s.set_microbatch_size(b);
  s.set_steps(1);
  if (model == "mlp") {
    s.mutable_model()->set_hidden(1024);  // 3 x 1M parameters, activations of 1024 a row
    s.mutable_model()->set_hidden_layers(3);
  } else {
    s.mutable_model()->set_d_model(16);  // 3 K parameters a block, 4 K of activations a row
    s.mutable_model()->set_n_heads(2);
    s.mutable_model()->set_n_layers(2);
    s.mutable_data()->set_seq_len(256);
  }
  absl::StatusOr<job::JobSpec> config = job::Validated(s);
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

// The traffic profile against the model's formulas counted here: an MLP of input 32, hidden
// 1024 (three layers) and 10 classes, float32, micro-batches of 8.
TEST(SchedulerHosts, TheTrafficProfileCountsEachLayersOutputAndParameterBytes) {
  const std::optional<planner::ModelProfile> profile = TrafficProfile(TwoByTwo("mlp", 8));
  ASSERT_TRUE(profile.has_value());
  const std::vector<planner::LayerProfile>& layers = profile->sizes.front().layers;
  ASSERT_EQ(layers.size(), 4u);
  EXPECT_EQ(layers[0].parameter_bytes, 4 * (32 * 1024 + 1024));
  EXPECT_EQ(layers[1].parameter_bytes, 4 * (1024 * 1024 + 1024));
  EXPECT_EQ(layers[3].parameter_bytes, 4 * (1024 * 10 + 10));
  EXPECT_EQ(layers[0].output_bytes, 4 * 8 * 1024);
  EXPECT_EQ(layers[3].output_bytes, 4 * 8 * 10);
  // A gpt's embedding turns [b, T] ids into [b, T, d].
  const std::optional<planner::ModelProfile> gpt = TrafficProfile(TwoByTwo("gpt", 8));
  ASSERT_TRUE(gpt.has_value());
  EXPECT_EQ(gpt->sizes.front().layers[0].output_bytes, 4 * 8 * 256 * 16);
  job::JobSpec script = TwoByTwo("mlp", 8);
  script.mutable_model()->set_name("torchscript");
  EXPECT_FALSE(TrafficProfile(script).has_value());
}

// Large parameters: each stage's replicas share a host (their AllReduce stays within it);
// large activations: each replica's stages do. In registration order (the negative control)
// the first job's AllReduces would cross hosts.
TEST(SchedulerHosts, TheHeavierTrafficStaysWithinHosts) {
  const Scheduler topology({kBeat, 3});
  const job::JobSpec parameters = TwoByTwo("mlp", 8);
  const job::JobSpec activations = TwoByTwo("gpt", 8);
  // rank = replica x 2 + stage
  PlacementPlan plan =
      topology.PlanQueue({{"mlp", 4, 0, "cpu", topology.PlacerFor(parameters)}}, TwoHosts());
  ASSERT_EQ(plan.started.size(), 1u);
  EXPECT_THAT(plan.started[0].rank_workers, ElementsAre("a1", "b1", "a2", "b2"));
  plan = topology.PlanQueue({{"gpt", 4, 0, "cpu", topology.PlacerFor(activations)}}, TwoHosts());
  ASSERT_EQ(plan.started.size(), 1u);
  EXPECT_THAT(plan.started[0].rank_workers, ElementsAre("a1", "a2", "b1", "b2"));

  SchedulerPolicy in_order_policy{kBeat, 3};
  in_order_policy.host_policy = HostPolicy::kInOrder;
  const Scheduler in_order(in_order_policy);
  EXPECT_FALSE(in_order.PlacerFor(parameters));
  plan = in_order.PlanQueue({{"mlp", 4, 0, "cpu", in_order.PlacerFor(parameters)}}, TwoHosts());
  ASSERT_EQ(plan.started.size(), 1u);
  EXPECT_THAT(plan.started[0].rank_workers, ElementsAre("a1", "a2", "b1", "b2"));
}

// A placer is asked only when the free workers are on several hosts, and an answer that does
// not fit them (a host with too few, a rank missing) is not used.
TEST(SchedulerHosts, APlacerIsAskedOnlyAcrossHostsAndABadAnswerIsNotUsed) {
  std::vector<std::vector<int>> asked;
  std::vector<int> answer = {0, 1, 0, 1};
  const HostPlacer placer = [&](const std::vector<int>& free_per_host) {
    asked.push_back(free_per_host);
    return answer;
  };
  std::vector<PoolWorker> pool = {{"a1"}, {"a2"}, {"b1"}, {"b2"}, {"b3"}};
  for (PoolWorker& w : pool) w.host = w.id.substr(0, 1);
  PlacementPlan plan = PlaceQueuedJobs({{"job", 4, 0, "cpu", placer}}, pool);
  ASSERT_EQ(plan.started.size(), 1u);
  EXPECT_THAT(plan.started[0].rank_workers, ElementsAre("a1", "b1", "a2", "b2"));
  EXPECT_THAT(asked, ElementsAre(ElementsAre(2, 3)));
  const std::vector<std::vector<int>> bad_answers = {{0, 0, 0, 1}, {0, 1}, {0, 1, 2, 1}};
  for (const std::vector<int>& bad : bad_answers) {
    answer = bad;
    plan = PlaceQueuedJobs({{"job", 4, 0, "cpu", placer}}, pool);
    ASSERT_EQ(plan.started.size(), 1u);
    EXPECT_THAT(plan.started[0].rank_workers, ElementsAre("a1", "a2", "b1", "b2"));
  }
  asked.clear();
  for (PoolWorker& w : pool) w.host = "one";
  plan = PlaceQueuedJobs({{"job", 4, 0, "cpu", placer}}, pool);
  EXPECT_THAT(plan.started[0].rank_workers, ElementsAre("a1", "a2", "b1", "b2"));
  EXPECT_THAT(asked, IsEmpty());
}

// A recovering job's next generation is placed on the hosts the same way.
TEST(SchedulerHosts, ARecoveringJobIsPlacedOnHostsByItsTraffic) {
  Recovering r;
  v1::JobSpec& s = *r.job.mutable_spec();
  s.mutable_model()->set_name("mlp");
  s.mutable_model()->set_hidden(1024);
  s.mutable_model()->set_hidden_layers(3);
  RecoveryPlan plan = Scheduler({kBeat, 3}).PlanRecovery(r.View(), TwoHosts(), kT0);
  ASSERT_TRUE(std::holds_alternative<StartGeneration>(plan));
  EXPECT_THAT(std::get<StartGeneration>(plan).rank_workers, ElementsAre("a1", "b1", "a2", "b2"));
}

}  // namespace
}  // namespace pipetrain::coordinator
