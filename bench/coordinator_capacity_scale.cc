// coordinator_capacity --scale: the cadence phase and the probes. See
// coordinator_capacity_scale.h.
#include "bench/coordinator_capacity_scale.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <mutex>
#include <queue>
#include <sstream>
#include <thread>

namespace pipetrain::bench::capacity {

double ProcessCpuSeconds(pid_t pid) {
  if (pid <= 0) return -1;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return -1;
  // After "pid (comm)": state is field 3; utime and stime are fields 14 and 15.
  std::istringstream fields(stat.substr(paren + 2));
  std::string field;
  double ticks = 0;
  for (int f = 3; f <= 15 && fields >> field; ++f) {
    if (f == 14 || f == 15) ticks += std::stod(field);
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

namespace {

struct Due {
  int64_t at_ns;
  int worker;
  bool heartbeat;
  bool operator>(const Due& o) const { return at_ns > o.at_ns; }
};

struct ThreadResult {
  int64_t due = 0, made = 0, errors = 0;
  std::string first_error;
  std::vector<double> heartbeat_us, report_us;
};

// One client thread: workers t, t + threads, ... each heartbeating every interval and
// reporting every step, at its own phase, until `end_ns`.
void Cadence(const std::string& target, Cluster& cluster, int t, int threads, int64_t start_ns,
             int64_t end_ns, int64_t interval_ns, int64_t step_ns, ThreadResult& r) {
  const int n = static_cast<int>(cluster.worker_ids.size());
  auto stub = v1::CoordinatorService::NewStub(OwnChannel(target));
  std::priority_queue<Due, std::vector<Due>, std::greater<Due>> queue;
  for (int i = t; i < n; i += threads) {
    // Heartbeats go on from each worker's last (so none goes silent for longer at the start);
    // reports at a phase of each worker's own within the step.
    const int64_t next_heartbeat = cluster.last_heartbeat[i].load() + interval_ns;
    queue.push({std::max(start_ns, next_heartbeat), i, true});
    queue.push({start_ns + step_ns * i / n, i, false});
  }
  while (!queue.empty()) {
    const Due due = queue.top();
    if (due.at_ns >= end_ns) break;
    queue.pop();
    ++r.due;
    const int64_t wait = due.at_ns - NowNs();
    if (wait > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(wait));
    const int i = due.worker;
    const int rank = cluster.rank_of_worker[i];
    grpc::ClientContext ctx;
    Prepare(&ctx);
    cluster.As(i, &ctx);
    grpc::Status s;
    const auto begun = Clock::now();
    if (due.heartbeat) {
      v1::HeartbeatRequest request;
      request.set_worker_id(cluster.worker_ids[i]);
      request.set_job_id(cluster.job_id);
      request.set_rank(rank);
      request.set_generation(1);
      v1::HeartbeatResponse response;
      s = stub->Heartbeat(&ctx, request, &response);
      cluster.last_heartbeat[i].store(NowNs(), std::memory_order_relaxed);
    } else {
      v1::StepReports reports;
      std::lock_guard<std::mutex> rank_lock(cluster.rank_mu[rank]);
      v1::StepReport& report = *reports.add_reports();
      report = cluster.NextReport(i, rank, 0.5, 0.1);
      report.set_generation(1);
      v1::ReportResponse response;
      s = stub->ReportSteps(&ctx, reports, &response);
      if (s.ok() && response.stop()) {
        s = grpc::Status(grpc::StatusCode::ABORTED, "the coordinator says stop");
      }
    }
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - begun).count();
    ++r.made;
    if (s.ok()) {
      (due.heartbeat ? r.heartbeat_us : r.report_us).push_back(us);
    } else if (r.errors++ == 0) {
      r.first_error = s.error_message();
    }
    queue.push({due.at_ns + (due.heartbeat ? interval_ns : step_ns), i, due.heartbeat});
  }
}

}  // namespace

CadenceResult RunCadence(const std::string& target, Cluster& cluster, pid_t coordinator_pid,
                         double seconds, double step_s, int threads) {
  const int64_t interval_ns = cluster.heartbeat_ms * 1000000;
  const int64_t step_ns = static_cast<int64_t>(step_s * 1e9);
  std::vector<ThreadResult> per_thread(threads);
  // A moment for every thread to connect, then the schedule starts for all at once.
  const int64_t start_ns = NowNs() + 500000000;
  const int64_t end_ns = start_ns + static_cast<int64_t>(seconds * 1e9);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      Cadence(target, cluster, t, threads, start_ns, end_ns, interval_ns, step_ns, per_thread[t]);
    });
  }
  std::this_thread::sleep_for(std::chrono::nanoseconds(start_ns - NowNs()));
  const double cpu_before = ProcessCpuSeconds(coordinator_pid);
  const auto begun = Clock::now();
  for (auto& th : pool) th.join();
  CadenceResult out;
  out.seconds = std::chrono::duration<double>(Clock::now() - begun).count();
  const double cpu_after = ProcessCpuSeconds(coordinator_pid);
  if (cpu_before >= 0 && cpu_after >= 0) out.coordinator_cpu_s = cpu_after - cpu_before;
  for (ThreadResult& r : per_thread) {
    out.calls_due += r.due;
    out.calls_made += r.made;
    out.errors += r.errors;
    if (out.first_error.empty()) out.first_error = r.first_error;
    out.heartbeat_us.insert(out.heartbeat_us.end(), r.heartbeat_us.begin(), r.heartbeat_us.end());
    out.report_us.insert(out.report_us.end(), r.report_us.begin(), r.report_us.end());
  }
  std::sort(out.heartbeat_us.begin(), out.heartbeat_us.end());
  std::sort(out.report_us.begin(), out.report_us.end());
  return out;
}

std::vector<ProbeResult> RunProbes(const std::string& target, const Cluster& cluster) {
  auto jobs = v1::JobService::NewStub(OwnChannel(target));
  ProbeResult status{"GetJob (the job's status)", {}, 0};
  ProbeResult workers{"ListWorkers (`pipetrain workers`)", {}, 0};
  for (int k = 0; k < 10; ++k) {
    {
      grpc::ClientContext ctx;
      Prepare(&ctx, 30);
      v1::GetJobRequest request;
      request.set_id(cluster.job_id);
      v1::Job job;
      const auto begun = Clock::now();
      const grpc::Status s = jobs->GetJob(&ctx, request, &job);
      if (!s.ok()) Die("GetJob: " + s.error_message());
      status.ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - begun).count());
      status.reply_bytes = static_cast<int64_t>(job.ByteSizeLong());
    }
    {
      grpc::ClientContext ctx;
      Prepare(&ctx, 30);
      v1::ListWorkersRequest request;
      v1::ListWorkersResponse response;
      const auto begun = Clock::now();
      const grpc::Status s = jobs->ListWorkers(&ctx, request, &response);
      if (!s.ok()) Die("ListWorkers: " + s.error_message());
      workers.ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - begun).count());
      workers.reply_bytes = static_cast<int64_t>(response.ByteSizeLong());
    }
  }
  std::sort(status.ms.begin(), status.ms.end());
  std::sort(workers.ms.begin(), workers.ms.end());
  return {status, workers};
}

}  // namespace pipetrain::bench::capacity
