// coordinator_capacity's measured phases and their table. See coordinator_capacity_phases.h.
#include "bench/coordinator_capacity_phases.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>

namespace pipetrain::bench::capacity {

PhaseResult RunPhase(const std::string& target, Cluster& cluster, Kind kind, int threads,
                     double seconds) {
  const int n = static_cast<int>(cluster.worker_ids.size());
  std::vector<PhaseResult> per_thread(threads);
  std::atomic<bool> go{false}, stop{false};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      auto stub = v1::CoordinatorService::NewStub(OwnChannel(target));
      PhaseResult& r = per_thread[t];
      r.latencies_us.reserve(1 << 16);
      // Connect before the clock starts.
      {
        grpc::ClientContext ctx;
        Prepare(&ctx);
        cluster.As(t % n, &ctx);
        v1::HeartbeatRequest hb;
        hb.set_worker_id(cluster.worker_ids[t % n]);
        v1::HeartbeatResponse resp;
        (void)stub->Heartbeat(&ctx, hb, &resp);
      }
      while (!go.load()) std::this_thread::yield();
      for (int64_t k = 0; !stop.load(std::memory_order_relaxed); ++k) {
        const int rank = static_cast<int>((t + k * threads) % n);
        const int i = cluster.worker_of_rank[rank];  // the worker that runs it
        const bool heartbeat = kind == Kind::kHeartbeat || (kind == Kind::kMixed && k % 2 == 0);
        grpc::ClientContext ctx;
        Prepare(&ctx);
        cluster.As(i, &ctx);
        grpc::Status s;
        const auto start = Clock::now();
        if (heartbeat) {
          v1::HeartbeatRequest request;
          request.set_worker_id(cluster.worker_ids[i]);
          request.set_job_id(cluster.job_id);
          request.set_rank(rank);
          v1::HeartbeatResponse response;
          s = stub->Heartbeat(&ctx, request, &response);
          cluster.last_heartbeat[i].store(NowNs(), std::memory_order_relaxed);
        } else {
          std::lock_guard<std::mutex> rank_lock(cluster.rank_mu[rank]);
          const v1::StepReport report = cluster.NextReport(i, rank, 0.02, 0.005);
          v1::ReportResponse response;
          s = stub->ReportStep(&ctx, report, &response);
          if (s.ok() && response.stop()) {
            s = grpc::Status(grpc::StatusCode::ABORTED, "the coordinator says stop");
          }
        }
        const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
        ++r.calls;
        if (s.ok()) {
          r.latencies_us.push_back(us);
        } else {
          if (r.errors++ == 0) r.first_error = s.error_message();
        }
      }
    });
  }
  // Let every thread connect, then measure.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto start = Clock::now();
  go.store(true);
  std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
  stop.store(true);
  for (auto& th : pool) th.join();
  PhaseResult total;
  total.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  for (auto& r : per_thread) {
    total.calls += r.calls;
    total.errors += r.errors;
    if (total.first_error.empty()) total.first_error = r.first_error;
    total.latencies_us.insert(total.latencies_us.end(), r.latencies_us.begin(),
                              r.latencies_us.end());
  }
  std::sort(total.latencies_us.begin(), total.latencies_us.end());
  return total;
}

double Percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const size_t i = std::min(sorted.size() - 1, static_cast<size_t>(q * (sorted.size() - 1) + 0.5));
  return sorted[i];
}

// One row per (client threads, kind of call), as a Markdown table.
void MeasureAndPrint(const Options& options, const std::string& target, Cluster& cluster) {
  const int n = options.workers;
  std::printf("| RPC | client threads | calls/s | p50 us | p99 us | calls | errors |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (int threads : options.threads) {
    for (Kind kind : {Kind::kHeartbeat, Kind::kReportStep, Kind::kMixed}) {
      const char* name = kind == Kind::kHeartbeat    ? "Heartbeat"
                         : kind == Kind::kReportStep ? "ReportStep"
                                                     : "mixed (alternating)";
      std::fprintf(stderr, "%s, %d threads, %.1f s...\n", name, threads, options.seconds);
      PhaseResult r = RunPhase(target, cluster, kind, threads, options.seconds);
      std::printf("| %s | %d | %.0f | %.0f | %.0f | %lld | %lld |\n", name, threads,
                  (r.calls - r.errors) / r.seconds, Percentile(r.latencies_us, 0.5),
                  Percentile(r.latencies_us, 0.99), static_cast<long long>(r.calls),
                  static_cast<long long>(r.errors));
      std::fflush(stdout);
      if (r.errors > 0) std::fprintf(stderr, "  first error: %s\n", r.first_error.c_str());
    }
  }
  std::printf(
      "\n%d simulated workers (one job: %d stages x %d replicas), %.1f s per row; "
      "latency = one call as the client sees it.\n",
      n, options.stages, n / options.stages, options.seconds);
}

}  // namespace pipetrain::bench::capacity
