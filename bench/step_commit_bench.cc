// step_commit_bench: what the step commit (job::Generation::commit_steps; docs/design.md 4.8) costs
// a step: the p − 1 one-element messages to every rank of the pipeline and the one-element
// AllReduce among the replicas that every rank waits for before its update.
//
// One job, every rank through RunStage over the Gloo transport (as stage processes and worker
// daemons run them: loopback TCP), the ranks as threads of this process meeting in a memory
// store, one intra-op thread each. A GPT (d_model 64 or --d-model, 4 blocks, sequences of 32, vocab
// 256, micro-batches of 4), float32, 1F1B; per layout (2 stages x 2 replicas, 2 x 3, 4 x 2) the job
// without and with the commit run in turn, the order swapped each round so that load swings
// fall on both alike. A run's step time is the median interval between rank 0's updates after
// its first. Prints per layout the median over rounds of each and the median of the per-round
// ratios with/without.
//
// Run:  build/bench/step_commit_bench [--rounds 7] [--steps 12] [--d-model 64]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/job/job_spec.h"
#include "runtime/job/launch/stage_run.h"
#include "runtime/rendezvous/key_value_store.h"

namespace pipetrain::bench {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

job::JobSpec Job(int stages, int replicas, int steps, int d_model) {
  job::JobSpec c;
  c.mutable_model()->set_name("gpt");
  c.mutable_model()->set_d_model(d_model);
  c.mutable_model()->set_n_heads(4);
  c.mutable_model()->set_n_layers(4);
  c.mutable_data()->set_vocab(256);
  c.mutable_data()->set_seq_len(32);
  c.mutable_data()->set_num_tokens(1 << 16);
  job::SetSchedule(c, schedule::ScheduleKind::kOneFOneB);
  c.set_stages(stages);
  c.set_replicas(replicas);
  c.set_microbatches(4);
  c.set_microbatch_size(4);
  c.set_steps(steps);
  c.clear_optimizer();
  c.mutable_optimizer()->set_name("adamw");
  c.mutable_optimizer()->set_lr(1e-3);
  c.set_threads_per_stage(1);
  c.set_timeout_s(120);
  return c;
}

// The median interval between rank 0's updates after its first, in seconds.
double StepTime(const job::JobSpec& c, bool commit) {
  std::shared_ptr<rendezvous::KeyValueStore> store = rendezvous::MakeMemoryStore();
  const int n = job::PipelineStages(c) * c.replicas();
  std::vector<absl::StatusOr<job::StageOutcome>> outcomes(n, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&, rank] {
      job::StageRunOptions options;
      options.generation.commit_steps = commit;
      outcomes[rank] = job::RunStage(c, rank, store, options);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int rank = 0; rank < n; ++rank) {
    if (!outcomes[rank].ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank,
                   std::string(outcomes[rank].status().message()).c_str());
      std::exit(1);
    }
  }
  const auto& steps = outcomes[0]->stats.steps;
  std::vector<double> intervals;
  for (size_t k = 1; k < steps.size(); ++k)
    intervals.push_back(steps[k].end_s - steps[k - 1].end_s);
  return Median(intervals);
}

int Main(int argc, char** argv) {
  int rounds = 7, steps = 12, d_model = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--rounds")) {
      rounds = std::atoi(argv[i + 1]);
    } else if (!std::strcmp(argv[i], "--steps")) {
      steps = std::atoi(argv[i + 1]);
    } else if (!std::strcmp(argv[i], "--d-model")) {
      d_model = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "usage: step_commit_bench [--rounds N] [--steps N] [--d-model N]\n");
      return 2;
    }
  }
  std::printf("d_model %d, %d steps a run\n\n", d_model, steps);
  std::printf(
      "| layout | step without (ms) | step with (ms) | with / without (median of %d "
      "paired rounds) |\n|---|---|---|---|\n",
      rounds);
  for (auto [p, w] : {std::pair{2, 2}, std::pair{2, 3}, std::pair{4, 2}}) {
    std::vector<double> without, with, ratios;
    for (int r = 0; r < rounds; ++r) {
      double off = 0, on = 0;
      if (r % 2 == 0) {
        off = StepTime(Job(p, w, steps, d_model), false);
        on = StepTime(Job(p, w, steps, d_model), true);
      } else {
        on = StepTime(Job(p, w, steps, d_model), true);
        off = StepTime(Job(p, w, steps, d_model), false);
      }
      without.push_back(off);
      with.push_back(on);
      ratios.push_back(on / off);
      std::this_thread::sleep_for(std::chrono::milliseconds(500));  // a rest between rounds
    }
    std::printf("| %d stages x %d replicas | %.1f | %.1f | %.3f |\n", p, w, Median(without) * 1e3,
                Median(with) * 1e3, Median(ratios));
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace pipetrain::bench

int main(int argc, char** argv) { return pipetrain::bench::Main(argc, argv); }
