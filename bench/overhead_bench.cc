// overhead_bench: what pipetrain's runtime costs on top of a plain LibTorch training loop.
//
// Times, in one process and interleaved (A, B, A, B, ... for several rounds, because the
// machine is noisy), the built-in GPT (default job config, AdamW lr 3e-3, seed 1):
//   A  pipetrain's RunInProcess with 1 stage, schedule 1f1b, m micro-batches of b rows;
//      step time = the time between consecutive step ends of stage 0 (what JobReport's
//      step_time_s is the median of);
//   B  a hand-written loop over the same layers (model::BuildModel, same seed) in one
//      StageModule: read the step's rows from the same dataset and sampler, forward,
//      cross-entropy, backward, torch::optim::AdamW step, zero_grad, loss.item(); step
//      time = the time between consecutive step ends.
// Rows: m=1 x b=64 vs plain b=64 (the aim is a ratio <= 1.02), m=8 x b=8 vs plain b=64 (the
// same 64 rows in one batch), and m=8 x b=8 vs a plain loop that accumulates gradients over
// the same 8 micro-batches of 8 (which separates micro-batching cost from runtime cost).
// Medians pool the step times of all rounds (the first step of each run is left out).
// Both sides run on a fresh thread with SetIntraOpThreads(threads) (LibTorch and OpenBLAS).
// Note: with 2 threads on a 2-core machine OpenMP's and OpenBLAS's spinning workers compete,
// and 2-thread timings are much noisier than 1-thread ones (see the per-round ratios).
//
// Run:  build-bench/bench/overhead_bench [--rounds 6] [--steps 30] [--threads 1,2]
// Prints a markdown table on stdout.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "runtime/base/threads.h"
#include "runtime/data/dataset.h"
#include "runtime/job/job_spec.h"
#include "runtime/job/launch/in_process.h"
#include "runtime/model/model_zoo.h"
#include "runtime/model/stage_module.h"

namespace pipetrain::bench {
namespace {

struct Options {
  int rounds = 6;  // even: each side goes first equally often
  int steps = 30;
  std::vector<int> threads = {1, 2};
};

[[noreturn]] void Usage(const char* argv0) {
  std::fprintf(stderr, "usage: %s [--rounds N] [--steps N] [--threads 1,2]\n", argv0);
  std::exit(2);
}

int PositiveInt(const char* text, const char* argv0) {
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < 1 || value > 1000000) Usage(argv0);
  return static_cast<int>(value);
}

Options ParseOptions(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) Usage(argv[0]);
    const char* value = argv[++i];
    if (arg == "--rounds") {
      o.rounds = PositiveInt(value, argv[0]);
    } else if (arg == "--steps") {
      o.steps = std::max(3, PositiveInt(value, argv[0]));
    } else if (arg == "--threads") {
      o.threads.clear();
      std::string list = value;
      size_t start = 0;
      while (start <= list.size()) {
        const size_t comma = std::min(list.find(',', start), list.size());
        o.threads.push_back(PositiveInt(list.substr(start, comma - start).c_str(), argv[0]));
        start = comma + 1;
      }
    } else {
      Usage(argv[0]);
    }
  }
  return o;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Differences of consecutive step end times: the first step (warm-up) is left out.
std::vector<double> StepTimes(const std::vector<double>& ends) {
  std::vector<double> out;
  for (size_t i = 1; i < ends.size(); ++i) out.push_back(ends[i] - ends[i - 1]);
  return out;
}

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <typename T>
T OrDie(absl::StatusOr<T> value, const char* what) {
  if (!value.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, std::string(value.status().message()).c_str());
    std::exit(1);
  }
  return *std::move(value);
}

job::JobSpec PipetrainConfig(int micro_batches, int micro_batch_size, int steps, int threads) {
  job::JobSpec c;  // the default GPT, data and AdamW
  job::SetSchedule(c, schedule::ScheduleKind::kOneFOneB);
  c.set_stages(1);
  c.set_microbatches(micro_batches);
  c.set_microbatch_size(micro_batch_size);
  c.set_steps(steps);
  c.set_threads_per_stage(threads);
  return c;
}

// A: pipetrain. Returns the step times of one run.
std::vector<double> RunPipetrain(const job::JobSpec& config) {
  job::JobReport report = OrDie(job::RunInProcess(config), "RunInProcess");
  std::vector<double> ends;
  for (const auto& step : report.stage_stats[0].steps) ends.push_back(step.end_s);
  return StepTimes(ends);
}

// B: the plain loop on the same model, data and optimizer settings as `config`. With
// `accumulate`, each step is config.microbatches() forward/backward passes of
// config.microbatch_size() rows (loss scaled by 1/m); otherwise one pass over all
// m * b rows of the step.
std::vector<double> RunPlainOnThisThread(const job::JobSpec& config, bool accumulate) {
  SetIntraOpThreads(config.threads_per_stage());
  data::SyntheticCorpusOptions data_options;
  data_options.vocab = config.data().vocab();
  data_options.branching = config.data().branching();
  data_options.num_tokens = config.data().num_tokens();
  data_options.seed = config.data().seed();
  data_options.window.seq_len = config.data().seq_len();
  std::unique_ptr<data::Dataset> dataset =
      OrDie(data::MakeSyntheticCorpus(data_options), "MakeSyntheticCorpus");
  data::BatchSampler sampler(dataset->num_samples(), config.seed(), /*replicas=*/1,
                             config.microbatches(), config.microbatch_size());

  model::ModelConfig model_config = job::ModelConfigOf(config);
  model_config.seed = config.seed();
  model_config.vocab_size = dataset->num_classes();
  model_config.seq_len = config.data().seq_len();
  model::StageModule module(0, OrDie(model::BuildModel(model_config), "BuildModel"));
  torch::optim::AdamW optimizer(module.Parameters(),
                                torch::optim::AdamWOptions(config.optimizer().lr())
                                    .betas({config.optimizer().beta1(), config.optimizer().beta2()})
                                    .eps(config.optimizer().eps())
                                    .weight_decay(config.optimizer().weight_decay()));

  const int passes = accumulate ? config.microbatches() : 1;
  std::vector<double> ends;
  for (int64_t t = 0; t < config.steps(); ++t) {
    double loss_sum = 0;
    for (int i = 0; i < passes; ++i) {
      const data::MicroBatch mb =
          dataset->Read(accumulate ? sampler.SampleIds(t, 0, i) : sampler.GlobalBatchIds(t));
      const at::Tensor inputs =
          torch::tensor(mb.input_tokens, torch::kLong).reshape(mb.input_shape);
      const at::Tensor targets = torch::tensor(mb.targets, torch::kLong).reshape(mb.target_shape);
      model::LayerContext ctx;
      ctx.micro_batch = t * passes + i;
      ctx.mini_batch = t;
      ctx.seed = config.seed();
      const at::Tensor logits = module.Forward(inputs, ctx);
      at::Tensor loss =
          at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
      if (passes > 1) loss = loss * (1.0 / passes);
      loss.backward();
      loss_sum += loss.item<double>();
    }
    optimizer.step();
    optimizer.zero_grad();
    if (!std::isfinite(loss_sum)) {
      std::fprintf(stderr, "plain loop: non-finite loss at step %lld\n", static_cast<long long>(t));
      std::exit(1);
    }
    ends.push_back(NowSeconds());
  }
  return StepTimes(ends);
}

// Runs RunPlainOnThisThread on a fresh thread, as RunInProcess runs its stage: each side then
// starts with its own OpenMP team.
std::vector<double> RunPlain(const job::JobSpec& config, bool accumulate) {
  std::vector<double> out;
  std::thread worker([&] { out = RunPlainOnThisThread(config, accumulate); });
  worker.join();
  return out;
}

struct Comparison {
  std::string name;
  int micro_batches, micro_batch_size;
  bool accumulate;
  std::string plain_name;
};

struct Samples {
  std::vector<double> pipetrain, plain;  // pooled step times
  std::vector<double> round_ratios;      // per-round median ratio
};

void Append(std::vector<double>* to, const std::vector<double>& from) {
  to->insert(to->end(), from.begin(), from.end());
}

}  // namespace
}  // namespace pipetrain::bench

int main(int argc, char** argv) {
  using namespace pipetrain::bench;
  const Options options = ParseOptions(argc, argv);
  const std::vector<Comparison> comparisons = {
      {"m=1 x b=64", 1, 64, false, "b=64"},
      {"m=8 x b=8", 8, 8, false, "b=64 (one batch)"},
      {"m=8 x b=8", 8, 8, true, "8 x b=8 (accumulated)"},
  };

  std::printf(
      "| threads | pipetrain (1 stage, 1f1b) | plain LibTorch loop | pipetrain ms | "
      "plain ms | ratio pipetrain/plain | per-round ratios (min..max) |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  std::fflush(stdout);
  for (int threads : options.threads) {
    for (const Comparison& cmp : comparisons) {
      const pipetrain::job::JobSpec config =
          PipetrainConfig(cmp.micro_batches, cmp.micro_batch_size, options.steps, threads);
      Samples s;
      // One unmeasured warm-up of each side (allocator, thread pools, page cache).
      {
        pipetrain::job::JobSpec warm = config;
        warm.set_steps(3);
        RunPipetrain(warm);
        RunPlain(warm, cmp.accumulate);
      }
      for (int round = 0; round < options.rounds; ++round) {
        // Alternate which side goes first so that slow drift does not favour either.
        std::vector<double> a, b;
        if (round % 2 == 0) {
          a = RunPipetrain(config);
          b = RunPlain(config, cmp.accumulate);
        } else {
          b = RunPlain(config, cmp.accumulate);
          a = RunPipetrain(config);
        }
        s.round_ratios.push_back(Median(a) / Median(b));
        Append(&s.pipetrain, a);
        Append(&s.plain, b);
      }
      const double a_ms = Median(s.pipetrain) * 1e3, b_ms = Median(s.plain) * 1e3;
      const auto [lo, hi] = std::minmax_element(s.round_ratios.begin(), s.round_ratios.end());
      std::printf("| %d | %s | %s | %.2f | %.2f | %.3f | %.3f..%.3f |\n", threads, cmp.name.c_str(),
                  cmp.plain_name.c_str(), a_ms, b_ms, a_ms / b_ms, *lo, *hi);
      std::fflush(stdout);
    }
  }
  std::printf(
      "\n%d rounds x %d steps per side and row, interleaved; medians pool all rounds' "
      "step times (first step of each run left out).\n",
      options.rounds, options.steps);
  return 0;
}
