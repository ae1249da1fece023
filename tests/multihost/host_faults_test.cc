// Faults only hosts have, each in the middle of a 2-stage x 2-replica float64 job over eight
// workers on four hosts (two each), with a checkpoint every 10 steps and one restart:
//   - a worker host's link goes down;
//   - a worker host dies (every process on it killed);
//   - a worker host is cut off from the coordinator's host only (its peers still reach it):
//     its workers' leases run out and the coordinator takes them for lost;
//   - the coordinator's host is cut off for 4 s and comes back.
// Each time the coordinator notices within two heartbeats (500 ms each) and the job resumes
// on the hosts that remain (or that come back) from its survivors' state where every place of
// the pipeline kept a replica that could report (a link down, a host cut off from the
// coordinator), else from its last checkpoint (a host that dies with both replicas of a
// place, the coordinator cut off from every worker), every step is
// committed exactly once by generations that only increase (nothing a rank of an ended
// generation did after its end is committed), and the run ends within 1e-10 of the
// un-pipelined reference.
#include "tests/daemons/committed_steps.h"
#include "tests/multihost/multihost_fixture.h"

#include "absl/strings/strip.h"

namespace pipetrain::test {
namespace {

using ::testing::HasSubstr;

enum class HostFault { kLinkDown, kHostDies, kCutFromTheCoordinator, kCoordinatorCutOff };

std::string FaultName(HostFault fault) {
  switch (fault) {
    case HostFault::kLinkDown: return "LinkDown";
    case HostFault::kHostDies: return "HostDies";
    case HostFault::kCutFromTheCoordinator: return "CutFromTheCoordinator";
    case HostFault::kCoordinatorCutOff: return "CoordinatorCutOff";
  }
  return "?";
}

class HostFaultTest : public MultihostTest, public ::testing::WithParamInterface<HostFault> {};

TEST_P(HostFaultTest, TheJobResumesFromItsCheckpointAndEndsAsTheReference) {
  const HostFault fault = GetParam();
  StartCoordinator();
  for (int host = 1; host <= kWorkerHosts; ++host) {
    for (int k = 0; k < kWorkersPerHost; ++k) {
      StartWorker(host, {"--listen", "0.0.0.0:0", "--iface", "eth0"}, Coordinator(),
                  absl::StrCat("worker-h", host, "-", k));
    }
  }
  ASSERT_TRUE(WaitForIdleWorkers(kWorkerHosts * kWorkersPerHost))
      << Slurp(dir_ / "coordinator.log");
  const int steps = 160;
  const fs::path job = WriteJob("faulted", 2, 2, steps, /*timeout_s=*/20,
                                absl::StrCat("checkpoint: {dir: ", (dir_ / "checkpoints").string(),
                                             ", every: 10, keep: 2}\nmax_restarts: 1\n"));
  const NamespaceHosts::Ran submitted = Cli({"submit", job.string()});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.out;
  const std::string id(absl::StripAsciiWhitespace(submitted.out));
  const nlohmann::json running = WaitForJob(
      id, [](const nlohmann::json& j) { return IntField(j, "step") >= 25; }, 120);
  ASSERT_EQ(running.value("state", ""), "JOB_STATE_RUNNING") << running.dump();
  // The host of rank 1's worker is the one that fails (or is cut off).
  const std::string victim_worker = running.at("stage_status")[1].value("worker_id", "");
  int victim = -1;
  for (const nlohmann::json& w : Workers()) {
    if (w.value("id", "") != victim_worker) continue;
    for (int h = 1; h <= kWorkerHosts; ++h) {
      if (w.value("address", "").rfind(hosts_->DataAddress(h) + ":", 0) == 0) victim = h;
    }
  }
  ASSERT_GE(victim, 1) << "rank 1 runs on " << victim_worker;
  const int64_t fault_ms = absl::ToUnixMillis(absl::Now());
  switch (fault) {
    case HostFault::kLinkDown: ASSERT_TRUE(hosts_->SetLink(victim, "eth0", false).ok()); break;
    case HostFault::kHostDies: hosts_->KillHost(victim); break;
    case HostFault::kCutFromTheCoordinator:
      ASSERT_TRUE(hosts_->Cut(victim, kCoordinatorHost).ok());
      break;
    case HostFault::kCoordinatorCutOff:
      ASSERT_TRUE(hosts_->SetLink(kCoordinatorHost, "eth0", false).ok());
      std::this_thread::sleep_for(std::chrono::seconds(4));
      ASSERT_TRUE(hosts_->SetLink(kCoordinatorHost, "eth0", true).ok());
      break;
  }
  const nlohmann::json done = WaitForJob(
      id,
      [](const nlohmann::json& j) {
        const std::string state = j.value("state", "");
        return state != "JOB_STATE_RUNNING" && state != "JOB_STATE_QUEUED";
      },
      240);
  ASSERT_EQ(done.value("state", ""), "JOB_STATE_SUCCEEDED")
      << done.dump() << Slurp(dir_ / "coordinator.log");
  ASSERT_GE(IntField(done, "restarts"), 1);
  const nlohmann::json& recovery = done.at("recoveries")[0];
  // Noticed within two heartbeat intervals (1 s), and a second for this loaded machine.
  const int64_t detected_ms = IntField(recovery, "detected_unix_ms");
  const int64_t resumed_at = IntField(recovery, "resumed_at_step");
  std::printf(
      "%s: detected %lld ms after the fault, the next generation placed %lld ms later (after a "
      "lost "
      "worker's lease unless the survivors went on), its first good step %lld ms after the "
      "fault; resumed at step %lld from %s, %lld steps run again; cause: %s\n",
      FaultName(fault).c_str(), static_cast<long long>(detected_ms - fault_ms),
      static_cast<long long>(IntField(recovery, "placed_unix_ms") - detected_ms),
      static_cast<long long>(IntField(recovery, "first_step_unix_ms") - fault_ms),
      static_cast<long long>(resumed_at),
      recovery.value("from_survivors", false) ? "the survivors' state" : "the checkpoint",
      static_cast<long long>(
          std::max<int64_t>(0, IntField(recovery, "failed_after_step") + 1 - resumed_at)),
      recovery.value("cause", "").c_str());
  if (fault != HostFault::kCoordinatorCutOff) {
    EXPECT_LE(detected_ms - fault_ms, 2000);
    // One of the victim host's workers (both are gone with it).
    EXPECT_THAT(recovery.value("cause", ""), HasSubstr(hosts_->DataAddress(victim) + ":"));
  }
  EXPECT_GE(IntField(recovery, "resumed_at_step"), 10);
  ExpectEveryStepOnceInIncreasingGenerations(CommittedSteps(dir_ / "jobs.db", id), steps,
                                             static_cast<int>(IntField(done, "generation")));
  // The last generation's layout (a restart may have taken a smaller one, the global batch
  // unchanged) saved the weights.
  EXPECT_LE(DifferenceFromReference(job, dir_ / "faulted-weights",
                                    static_cast<int>(IntField(done, "stages"))),
            1e-10);
  if (fault == HostFault::kCutFromTheCoordinator) {
    // Its workers' leases ran out: each stopped the rank it ran, saying why, and that rank
    // ended (a wait of it on the coordinator's store ends at its own deadline).
    for (int k = 0; k < kWorkersPerHost; ++k) {
      const fs::path log = dir_ / absl::StrCat("worker-h", victim, "-", k, ".log");
      if (Slurp(log).find("running rank") == std::string::npos) continue;
      EXPECT_THAT(Slurp(log), HasSubstr("no heartbeat answered by the coordinator"));
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (Slurp(log).find("failed: ") == std::string::npos &&
             std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
      EXPECT_THAT(Slurp(log), HasSubstr("failed: "));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Faults, HostFaultTest,
                         ::testing::Values(HostFault::kLinkDown, HostFault::kHostDies,
                                           HostFault::kCutFromTheCoordinator,
                                           HostFault::kCoordinatorCutOff),
                         [](const auto& info) { return FaultName(info.param); });

}  // namespace
}  // namespace pipetrain::test
