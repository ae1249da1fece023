// The coordinator plans `stages: auto` at submission: for the workers there are, bounded in CPU and
// time, one plan at a time. The coordinator's rules without processes, sockets or sleeps
// (coordinator_fixture.h); the daemon tests (tests/daemons) check the same rules end to end over
// gRPC.
#include "tests/coordinator/coordinator_fixture.h"

namespace pipetrain::coordinator::core_test {
namespace {

using ::testing::HasSubstr;

// `stages: auto`: planned at submission with the model's profile for the workers registered
// then; the job keeps the planned layout in its spec (same global batch) and the plan; no
// profile, no worker, a profile of another model or too little memory are clear errors that
// keep nothing.
TEST_F(CoordinatorCoreTest, StagesAutoIsPlannedForTheWorkersThereAre) {
  v1::JobSpec spec = Spec(2);
  spec.clear_stages();
  spec.set_auto_stages(true);
  const auto refused = [&](const std::string& profile, absl::StatusCode code,
                           const std::string& needle) {
    absl::StatusOr<v1::Job> job = coordinator_->jobs().Submit(spec, profile);
    ASSERT_FALSE(job.ok());
    EXPECT_EQ(job.status().code(), code) << job.status();
    EXPECT_THAT(std::string(job.status().message()), HasSubstr(needle));
    EXPECT_EQ(coordinator_->jobs().List()->jobs_size(), 0);
  };
  // The spec's GPT has 2 blocks: 5 layers.
  const auto profile = [](int layers) {
    planner::ModelProfile p;
    p.p2p = {1e-5, 1e9};
    p.allreduce = {1e-5, 1e9};
    for (int b : {1, 2, 4}) {
      planner::MicroBatchProfile size;
      size.micro_batch_size = b;
      for (int l = 0; l < layers; ++l) {
        size.layers.push_back(
            {"layer", 0.01 * b, 0.02 * b, 0.001, 1000 * b, 1 << 20, 2 << 20, 4000 * b, 100});
      }
      p.sizes.push_back(size);
    }
    return planner::ModelProfileToJson(p);
  };
  refused("", absl::StatusCode::kInvalidArgument, "needs the model's profile");
  refused("{", absl::StatusCode::kInvalidArgument, "model_profile_json: ");
  refused(profile(5), absl::StatusCode::kFailedPrecondition, "no workers to plan for");
  Register(1);
  Register(2);
  refused(profile(3), absl::StatusCode::kInvalidArgument,
          "profiles 3 layers; the job's model has 5");

  const v1::Job job = Submit(spec, profile(5));
  ASSERT_TRUE(job.has_plan());
  EXPECT_EQ(job.plan().planner(), "2bw");
  EXPECT_EQ(job.plan().workers(), 2);
  EXPECT_FALSE(job.spec().auto_stages());
  EXPECT_LE(job.stages() * job.replicas(), 2);
  EXPECT_EQ(job.spec().stage_ranges_size(), job.stages());
  EXPECT_EQ(job.spec().stage_ranges(0).begin(), 0);
  EXPECT_EQ(job.spec().stage_ranges(job.stages() - 1).end(), 5);
  EXPECT_EQ(job.replicas() * job.spec().microbatches() * job.spec().microbatch_size(), 4);
  EXPECT_EQ(job.plan().predicted_peak_memory_bytes_size(), job.stages());
  EXPECT_GT(job.plan().predicted_step_time_s(), 0);
  EXPECT_FALSE(job.plan().layout().empty());
  // What the workers are given is a job like any other: it validates as it stands.
  EXPECT_TRUE(job::Validated(job.spec()).ok());

  // A worker with 1 MiB: nothing fits in it.
  v1::RegisterWorkerRequest small;
  small.set_address("host-9:7000");
  small.set_memory_bytes(1 << 20);
  ASSERT_TRUE(RegisterAsNewProcess(small).ok());
  absl::StatusOr<v1::Job> tight = coordinator_->jobs().Submit(spec, profile(5));
  ASSERT_FALSE(tight.ok());
  EXPECT_EQ(tight.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(tight.status().message()), HasSubstr("does not fit: needs "));
  EXPECT_THAT(std::string(tight.status().message()), HasSubstr(", have 943718 (90% of 1048576)"));
}

// Planning at submission is bounded: a profile at the limits (256 layers, 8 micro-batch sizes)
// for 16 workers with Hippie's recomputation search is planned in seconds, and one past them
// is refused.
// A spec planned at the coordinator's limits (Hippie, 256 layers, B = 128) and its profile
// at `sizes` micro-batch sizes.
v1::JobSpec SpecAtThePlanningLimits() {
  v1::JobSpec spec = testing_fakes::ValidSpec(2);
  spec.clear_stages();
  spec.set_auto_stages(true);
  spec.set_planner("hippie");
  spec.mutable_model()->set_n_layers(253);  // 256 layers
  spec.set_microbatches(16);
  spec.set_microbatch_size(8);  // B = 128
  return spec;
}
std::string ProfileAtThePlanningLimits(int sizes) {
  planner::ModelProfile p;
  p.p2p = {1e-5, 1e9};
  p.allreduce = {1e-5, 1e9};
  for (int i = 0; i < sizes; ++i) {
    const int b = 1 << i;
    planner::MicroBatchProfile size;
    size.micro_batch_size = b;
    for (int l = 0; l < 256; ++l) {
      size.layers.push_back({"layer", 0.001 * b * (1 + l % 3), 0.002 * b, 0.0001, 1000 * b, 1 << 16,
                             2 << 16, 4000 * b * (1 + l % 5), 100});
    }
    p.sizes.push_back(size);
  }
  return planner::ModelProfileToJson(p);
}

TEST_F(CoordinatorCoreTest, PlanningAtTheLimitsIsBounded) {
  const v1::JobSpec spec = SpecAtThePlanningLimits();
  for (int n = 1; n <= 20; ++n) Register(n);
  const auto start = std::chrono::steady_clock::now();
  const v1::Job job = Submit(spec, ProfileAtThePlanningLimits(8));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(job.has_plan());
  EXPECT_EQ(job.plan().workers(), 16);
  EXPECT_LT(seconds, 20.0);
  std::printf("planned 256 layers x 8 sizes for 16 workers in %.2f s (%d layouts)\n", seconds,
              job.plan().layouts_considered());
  absl::StatusOr<v1::Job> refused =
      coordinator_->jobs().Submit(spec, ProfileAtThePlanningLimits(9));
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("plans at most 256 layers at 8 sizes"));
}

// Planning at submission is bounded: one plan at a time (at most two more wait; the rest are
// refused at once), each within its CPU budget, and the coordinator answers meanwhile (eight
// plans at once once took 78 s each and slowed a running job twelvefold).
TEST_F(CoordinatorCoreTest, PlanningIsOneAtATimeWithinItsBudgetAndTheCoordinatorAnswers) {
  for (int n = 1; n <= 20; ++n) Register(n);
  const v1::JobSpec spec = SpecAtThePlanningLimits();
  const std::string profile = ProfileAtThePlanningLimits(4);
  std::vector<absl::Status> results(6);
  std::vector<std::thread> submitters;
  for (size_t i = 0; i < results.size(); ++i) {
    submitters.emplace_back(
        [&, i] { results[i] = coordinator_->jobs().Submit(spec, profile).status(); });
  }
  double slowest_list_ms = 0;
  for (int i = 0; i < 20; ++i) {
    const auto start = std::chrono::steady_clock::now();
    (void)coordinator_->jobs().List(10);
    slowest_list_ms =
        std::max(slowest_list_ms,
                 std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (auto& t : submitters) t.join();
  int planned = 0, refused_at_once = 0, no_turn = 0;
  for (const absl::Status& s : results) {
    if (s.ok()) ++planned;
    if (absl::IsResourceExhausted(s)) {
      const std::string message(s.message());
      if (message.find("planning other jobs (one at a time, 2 waiting)") != std::string::npos) {
        ++refused_at_once;
      } else {
        EXPECT_THAT(message, HasSubstr("no turn to plan within 30s"));  // a very busy machine
        ++no_turn;
      }
    }
  }
  std::printf(
      "6 plans at once: %d planned, %d refused at once, %d without a turn; slowest "
      "List %.1f ms\n",
      planned, refused_at_once, no_turn, slowest_list_ms);
  EXPECT_EQ(planned + refused_at_once + no_turn, 6);
  EXPECT_EQ(refused_at_once, 3);  // one running, two waiting: the rest refused at once
  EXPECT_GE(planned, 1);
  EXPECT_LT(slowest_list_ms, 500);
}

// A plan over its CPU budget stops, naming the budget, and keeps nothing.
TEST(CoordinatorPlanningBudget, APlanOverItsCpuBudgetIsRefusedNamingIt) {
  CoordinatorOptions options;
  options.planning_cpu_budget = absl::Milliseconds(20);
  CoordinatorDeps deps;
  auto data = std::make_shared<FakeStore::Data>();
  deps.store = std::make_unique<FakeStore>(data);
  deps.clock = std::make_shared<FakeClock>();
  auto worker = std::make_shared<FakeWorker>();
  deps.connect = [worker](const std::string&,
                          const std::string& key) -> absl::StatusOr<std::shared_ptr<WorkerClient>> {
    return std::shared_ptr<WorkerClient>(std::make_shared<KeyedClient>(worker, key));
  };
  deps.run_later = [](std::function<void()> call) { call(); };
  deps.start_monitor = false;
  auto coordinator = Coordinator::Open(options, std::move(deps));
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  for (int n = 1; n <= 16; ++n) {
    v1::RegisterWorkerRequest r;
    r.set_address("host-" + std::to_string(n) + ":7000");
    r.set_command_key(rpc::RandomKey());
    ASSERT_TRUE((*coordinator)->workers().Register(r).ok());
  }
  absl::StatusOr<v1::Job> over =
      (*coordinator)->jobs().Submit(SpecAtThePlanningLimits(), ProfileAtThePlanningLimits(8));
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(over.status().message()), HasSubstr("over its budget of 20ms of CPU"));
  auto listed = (*coordinator)->jobs().List(10);
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->jobs_size(), 0);
}

}  // namespace
}  // namespace pipetrain::coordinator::core_test
