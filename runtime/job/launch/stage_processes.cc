#include "runtime/job/launch/stage_processes.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "runtime/base/clock.h"
#include "runtime/base/rank_layout.h"
#include "runtime/base/self_executable.h"
#include "runtime/base/status_macros.h"
#include "runtime/base/subprocess.h"
#include "runtime/base/threads.h"
#include "runtime/checkpoint/checkpoint_dir.h"
#include "runtime/job/device.h"
#include "runtime/job/launch/stage_run.h"
#include "runtime/job/plan.h"
#include "runtime/rendezvous/key_value_store.h"
#include "runtime/transport/gloo/gloo_transport.h"

namespace pipetrain::job {

const char kReportedToLauncher[] = "pipetrain.reported_to_launcher";

namespace {

namespace fs = std::filesystem;

constexpr char kLoopback[] = "127.0.0.1";

std::string ProgressKey(const char* what, int64_t step) {
  return absl::StrCat("progress/", what, "/", step);
}

// `x` as text that absl::SimpleAtod reads back bitwise (StrCat keeps 6 digits only).
std::string RoundTripText(double x) { return absl::StrFormat("%.17g", x); }

// A stage process's steps, told to its launcher through the job's store: each replica's
// evaluation and loss, and replica 0's stage 0 the gradient norm and the step's end.
class ProgressToLauncher : public StageListener {
 public:
  ProgressToLauncher(rendezvous::KeyValueStore& store, int stage, int replica)
      : store_(store), stage_(stage), replica_(replica) {}

  void StepDone(const executor::StepRecord& step) override {
    if (step.eval) {  // before the loss, which the launcher reads first
      (void)store_.Set(
          absl::StrCat(ProgressKey("eval", step.step), "/", replica_),
          absl::StrCat(RoundTripText(step.eval->loss), " ", RoundTripText(step.eval->accuracy)));
    }
    if (step.mean_loss) {
      (void)store_.Set(absl::StrCat(ProgressKey("loss", step.step), "/", replica_),
                       RoundTripText(*step.mean_loss));
    }
    if (stage_ == 0 && replica_ == 0) {
      if (step.grad_norm) {  // before the end, which the launcher reads first
        (void)store_.Set(ProgressKey("grad_norm", step.step), RoundTripText(*step.grad_norm));
      }
      (void)store_.Set(ProgressKey("end", step.step), RoundTripText(step.end_s));
    }
  }

 private:
  rendezvous::KeyValueStore& store_;
  const int stage_, replica_;
};

}  // namespace

absl::Status RunStageProcess(const JobSpec& c, const StageProcessArgs& args) {
  // Die with the launcher, whatever ends it (Ctrl-C, a kill, a crash).
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() == 1) return absl::AbortedError("the launcher is gone");
  PT_ASSIGN_OR_RETURN(
      std::shared_ptr<rendezvous::KeyValueStore> store,
      rendezvous::ConnectTcpStore(kLoopback, args.store_port, absl::Seconds(c.timeout_s())));
  // Errors go to the launcher through the store; marked so the caller need not print them.
  auto fail = [&](absl::Status status) {
    if (store->Set(absl::StrCat("error/", args.rank), std::string(status.message())).ok()) {
      status.SetPayload(kReportedToLauncher, absl::Cord("1"));
    }
    return status;
  };
  const RankLayout layout{std::max(1, PipelineStages(c)), c.replicas()};
  const int stage = layout.StageOf(args.rank), replica = layout.ReplicaOf(args.rank);
  ProgressToLauncher progress(*store, stage, replica);
  StageRunOptions options;
  options.listener = &progress;
  absl::StatusOr<StageOutcome> outcome = RunStage(c, args.rank, store, options);
  if (!outcome.ok()) return fail(outcome.status());
  if (absl::Status s = WriteStageOutcome(args.result_dir, args.rank, *outcome); !s.ok()) {
    return fail(s);
  }
  if (absl::Status s = SaveStageWeights(c, args.rank, *outcome); !s.ok()) return fail(s);
  return absl::OkStatus();
}

absl::StatusOr<JobReport> RunAsProcesses(const JobSpec& c, const ProcessRunOptions& options) {
  PT_ASSIGN_OR_RETURN(JobPlan plan, MakeJobPlan(c));
  PT_RETURN_IF_ERROR(DeviceForRank(c, 0).status());  // once here, not from every rank
  const int p = plan.ranks() * c.replicas();         // processes, rank = replica * ranks + place
  PT_ASSIGN_OR_RETURN(std::unique_ptr<rendezvous::KeyValueStore> store,
                      rendezvous::ServeTcpStore(kLoopback, 0));
  const int port = rendezvous::TcpStorePort(*store);
  char dir_template[] = "/tmp/pipetrain-run-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) return absl::InternalError("cannot create a temp dir");
  const std::string result_dir = dir_template;
  struct RemoveDir {
    std::string path;
    ~RemoveDir() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  } remove_dir{result_dir};

  const std::string self = SelfExecutable();
  if (self.empty() || options.command.empty()) {
    return absl::InternalError("cannot find this program's own executable to start stages");
  }
  const double start_s = MonotonicSeconds();
  std::vector<pid_t> pids(p, -1);
  for (int s = 0; s < p; ++s) {
    std::vector<std::string> args = options.command;
    args[0] = self;
    for (const std::string& a :
         {std::string("--stage-process"), absl::StrCat(s), std::string("--store-port"),
          absl::StrCat(port), std::string("--result-dir"), result_dir}) {
      args.push_back(a);
    }
    subprocess::Options spawn;
    spawn.stdin_null = false;  // as the launcher's
    absl::StatusOr<pid_t> pid = subprocess::Start(args, spawn);
    if (!pid.ok()) {
      for (int k = 0; k < s; ++k) subprocess::Stop(pids[k], SIGKILL, absl::ZeroDuration());
      return absl::InternalError(
          absl::StrCat("cannot start the process of rank ", s, ": ", pid.status().message()));
    }
    pids[s] = *pid;
  }

  // Progress, in step order, from what the stages publish in the store. Once every stage
  // has exited, whatever they published is there: the first key missing then ends it.
  std::atomic<bool> finished{false};
  // A resumed job starts at its checkpoint's step: the one rank 0 found and published.
  std::optional<ProgressTracker> tracker;
  int64_t first_step = 0;
  std::thread progress([&] {
    if (!c.resume_from().empty()) {
      while (!finished) {
        auto published = store->Get("resume/checkpoint", absl::Milliseconds(200));
        if (!published.ok()) continue;
        const nlohmann::json j = nlohmann::json::parse(*published, nullptr, false);
        if (j.is_object() && j.contains("dir")) {
          auto opened = checkpoint::OpenCheckpoint(j["dir"].get<std::string>());
          if (opened.ok()) first_step = opened->manifest.step;
        }
        break;
      }
    }
    tracker.emplace(c, plan, start_s, options.on_progress, first_step);
    for (int64_t t = first_step; t < c.steps(); ++t) {
      std::vector<std::string> keys;
      for (int r = 0; r < c.replicas(); ++r)
        keys.push_back(absl::StrCat(ProgressKey("loss", t), "/", r));
      keys.push_back(ProgressKey("end", t));
      for (size_t k = 0; k < keys.size(); ++k) {
        while (true) {
          const bool last_look = finished;
          auto v = store->Get(keys[k], absl::Milliseconds(last_look ? 1 : 200));
          if (!v.ok()) {
            if (last_look) return;
            continue;
          }
          double x = 0;
          if (!absl::SimpleAtod(*v, &x)) break;
          if (k + 1 < keys.size()) {
            tracker->LossKnown(t, x);
          } else {
            // Rank 0 sets a step's norm (with clipping) before its end.
            std::optional<double> grad_norm;
            const std::string norm_key = ProgressKey("grad_norm", t);
            if (absl::StatusOr<bool> has = store->Check({norm_key}); has.ok() && *has) {
              auto norm = store->Get(norm_key, absl::Milliseconds(200));
              double n = 0;
              if (norm.ok() && absl::SimpleAtod(*norm, &n)) grad_norm = n;
            }
            tracker->StepEnded(t, x, grad_norm);
          }
          break;
        }
      }
      if (c.eval().every() > 0 && (t + 1) % c.eval().every() == 0) {
        for (int r = 0; r < c.replicas(); ++r) {
          auto v =
              store->Get(absl::StrCat(ProgressKey("eval", t), "/", r), absl::Milliseconds(200));
          std::vector<std::string> parts;
          if (v.ok()) parts = absl::StrSplit(*v, ' ');
          executor::EvalRecord eval;
          if (parts.size() == 2 && absl::SimpleAtod(parts[0], &eval.loss) &&
              absl::SimpleAtod(parts[1], &eval.accuracy)) {
            tracker->EvalKnown(t, eval);
          }
        }
      }
    }
  });

  // Wait for every stage; after the first failure, give the rest `stop_grace`, then kill.
  std::vector<int> statuses(p, 0);
  std::vector<bool> running(p, true);
  int alive = p;
  absl::Time kill_at = absl::InfiniteFuture();
  while (alive > 0) {
    for (int s = 0; s < p; ++s) {
      if (!running[s]) continue;
      int status = 0;
      if (waitpid(pids[s], &status, WNOHANG) == pids[s]) {
        running[s] = false;
        statuses[s] = status;
        --alive;
        if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0) && kill_at == absl::InfiniteFuture()) {
          kill_at = absl::Now() + options.stop_grace;
        }
      }
    }
    if (absl::Now() >= kill_at) {
      for (int s = 0; s < p; ++s) {
        if (running[s]) kill(pids[s], SIGKILL);
      }
    }
    if (alive > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  finished = true;
  progress.join();

  // Stages that died without a word (the likely cause) first, then what the others said.
  std::vector<std::string> died, reported;
  for (int s = 0; s < p; ++s) {
    const int status = statuses[s];
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
    auto error = store->Get(absl::StrCat("error/", s), absl::Milliseconds(1));
    if (error.ok()) {
      reported.push_back(*error);
    } else {
      died.push_back(absl::StrCat(RankLayout{plan.ranks(), c.replicas()}.Describe(s), " (pid ",
                                  pids[s], ") ", subprocess::DescribeExit(status)));
    }
  }
  std::vector<std::string> failures = died;
  failures.insert(failures.end(), reported.begin(), reported.end());
  if (!failures.empty()) {
    return absl::UnavailableError(absl::StrJoin(failures, "; "));
  }
  std::vector<StageOutcome> outcomes;
  for (int s = 0; s < p; ++s) {
    PT_ASSIGN_OR_RETURN(StageOutcome out, ReadStageOutcome(result_dir, s));
    outcomes.push_back(std::move(out));
  }
  PT_ASSIGN_OR_RETURN(JobReport report,
                      AssembleReport(c, plan, std::move(outcomes), tracker->Losses(),
                                     tracker->GradNorms(), tracker->Evals(), first_step, start_s));
  return report;
}

}  // namespace pipetrain::job
