// A survivor's part after a fault. See survivor_handoff.h.
#include "worker/survivor_handoff.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/base/byte_size.h"
#include "runtime/job/launch/stage_run.h"

namespace pipetrain::worker {
namespace {

// The longest a WAIT may make the rank wait, whatever it names.
constexpr absl::Duration kLongestWait = absl::Minutes(5);

}  // namespace

SurvivorOutcome HandOffSurvivor(CoordinatorClient& coordinator, const v1::StageAssignment& a,
                                const std::string& worker_id, const job::JobSpec& config,
                                const job::StoppedRank& stopped,
                                const std::function<bool()>& closing, HeldStates* held) {
  SurvivorOutcome out;
  const std::string who =
      absl::StrCat("pipetrain-worker: ", worker_id, ": rank ", a.rank(), " of ", a.job_id(), ": ");
  v1::StoppedRank report;
  report.set_worker_id(worker_id);
  report.set_job_id(a.job_id());
  report.set_rank(a.rank());
  report.set_generation(a.generation());
  report.set_next_step(stopped.state.next_step);
  report.set_held_step(stopped.state.held_step);
  if (stopped.state.held_loss) {
    report.set_has_held_loss(true);
    report.set_held_loss(*stopped.state.held_loss);
  }
  report.set_error(std::string(stopped.error.message()));
  report.set_failed_after_peer(stopped.error.GetPayload(job::kFailedAfterPeerPayload).has_value());
  for (const model::LayerRange& range : stopped.layers) {
    for (int layer = range.begin; layer < range.end; ++layer) report.add_layers(layer);
  }
  absl::Time deadline = absl::Now() + kLongestWait;
  int failed_calls = 0;
  v1::SurvivorInstruction answer;
  while (true) {
    absl::StatusOr<v1::SurvivorInstruction> r = coordinator.ReportStopped(report, absl::Seconds(2));
    if (!r.ok()) {
      if (++failed_calls >= kSurvivorAttempts) {
        std::fprintf(stderr, "%sthe coordinator took no survivor's report (%s): giving up\n",
                     who.c_str(), std::string(r.status().message()).c_str());
        return out;
      }
    } else if (r->action() != v1::SurvivorInstruction::WAIT) {
      answer = *std::move(r);
      break;
    } else {
      failed_calls = 0;
      // The coordinator's deadline is absolute: a later answer never moves it further away.
      deadline =
          std::min(deadline, absl::Now() + absl::Milliseconds(std::max<int64_t>(0, r->wait_ms())));
    }
    if (closing()) {
      std::fprintf(stderr, "%sthe worker is closing: not waiting for the survivors' plan\n",
                   who.c_str());
      return out;
    }
    if (absl::Now() >= deadline) {
      std::fprintf(stderr, "%sno survivors' plan came in time: giving up\n", who.c_str());
      return out;
    }
    absl::SleepFor(kSurvivorPoll);
  }
  if (answer.action() != v1::SurvivorInstruction::GO_ON) {
    std::fprintf(stderr, "%sthe survivors do not go on: %s\n", who.c_str(),
                 answer.reason().c_str());
    return out;
  }
  if (answer.apply_held_update()) {
    if (absl::Status applied = stopped.apply_held_update(); !applied.ok()) {
      out.failed = absl::StrCat("applying its held update: ", applied.message());
      std::fprintf(stderr, "%s%s\n", who.c_str(), out.failed.c_str());
      return out;
    }
  }
  if (answer.hold_state() && held != nullptr) {
    // Its layers as they now stand (W(step)), kept for the next generation's ranks.
    std::map<int, std::string> layers = job::StoppedRankLayerBytes(stopped);
    int64_t bytes = 0;
    for (const auto& [layer, b] : layers) bytes += static_cast<int64_t>(b.size());
    held->Hold(a.job_id(), answer.step(), answer.state_key(),
               absl::Milliseconds(std::max<int64_t>(0, answer.hold_ms())), std::move(layers));
    std::fprintf(stderr, "%sholding its state at step %lld for the next generation (%s)\n",
                 who.c_str(), static_cast<long long>(answer.step()), ByteSize(bytes).c_str());
  }
  if (!answer.write_state()) {
    std::fprintf(stderr,
                 "%sthe survivors go on from step %lld (another replica writes this "
                 "place's state)\n",
                 who.c_str(), static_cast<long long>(answer.step()));
    return out;
  }
  std::shared_ptr<rendezvous::KeyValueStore> store =
      coordinator.JobStore(a.job_id(), a.generation());
  checkpoint::SharedCheckpointResult saved =
      job::DeliverStoppedRank(*store, config, stopped, answer.step(), a.generation());
  if (!saved.status.ok()) {
    out.failed = std::string(saved.status.message());
    std::fprintf(stderr, "%swriting its state before step %lld failed: %s\n", who.c_str(),
                 static_cast<long long>(answer.step()), out.failed.c_str());
    return out;
  }
  out.step = answer.step();
  out.checkpoint = saved.committed;
  std::fprintf(
      stderr, "%sthe survivors go on from step %lld: its state written%s\n", who.c_str(),
      static_cast<long long>(answer.step()),
      saved.committed.empty() ? "" : absl::StrCat(", committed ", saved.committed).c_str());
  return out;
}

}  // namespace pipetrain::worker
