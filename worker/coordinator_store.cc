#include "worker/coordinator_store.h"

#include <algorithm>
#include <chrono>
#include <set>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "rpc/status.h"

namespace pipetrain::worker {
namespace {

class CoordinatorStore : public rendezvous::KeyValueStore {
 public:
  CoordinatorStore(std::shared_ptr<v1::CoordinatorService::Stub> stub, std::string job_id,
                   int generation)
      : stub_(std::move(stub)), job_id_(std::move(job_id)), generation_(generation) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    v1::KvRequest request = Request(key);
    request.set_value(value);
    return Call(&v1::CoordinatorService::Stub::KvSet, request, absl::Seconds(10)).status();
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      if (absl::Status aborted = Aborted(); !aborted.ok()) return aborted;
      const absl::Duration left = deadline - absl::Now();
      v1::KvRequest request = Request(key);
      request.set_wait_ms(std::clamp<int64_t>(absl::ToInt64Milliseconds(left), 0, 5000));
      absl::StatusOr<v1::KvResponse> r =
          Call(&v1::CoordinatorService::Stub::KvGet, request,
               absl::Milliseconds(request.wait_ms()) + absl::Seconds(10));
      if (!r.ok()) return r.status();
      if (r->found()) return r->value();
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "rendezvous: '", key, "' was not set within ", absl::FormatDuration(timeout)));
      }
    }
  }
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    v1::KvRequest request = Request(key);
    request.set_delta(delta);
    absl::StatusOr<v1::KvResponse> r =
        Call(&v1::CoordinatorService::Stub::KvAdd, request, absl::Seconds(10));
    if (!r.ok()) return r.status();
    return r->number();
  }
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys) override {
    v1::KvRequest request = Request("");
    for (const std::string& k : keys) request.add_keys(k);
    absl::StatusOr<v1::KvResponse> r =
        Call(&v1::CoordinatorService::Stub::KvCheck, request, absl::Seconds(10));
    if (!r.ok()) return r.status();
    return r->found();
  }
  absl::Status Delete(const std::string& key) override {
    return Call(&v1::CoordinatorService::Stub::KvDelete, Request(key), absl::Seconds(10)).status();
  }
  void Abort(const absl::Status& why) override {
    absl::MutexLock lock(&mu_);
    if (!aborted_.ok()) return;
    aborted_ = why.ok() ? absl::CancelledError("the stage stopped") : why;
    for (grpc::ClientContext* ctx : in_flight_) ctx->TryCancel();
  }

 private:
  v1::KvRequest Request(const std::string& key) const {
    v1::KvRequest request;
    request.set_job_id(job_id_);
    request.set_generation(generation_);
    request.set_key(key);
    return request;
  }
  absl::StatusOr<v1::KvResponse> Call(
      grpc::Status (v1::CoordinatorService::Stub::*method)(grpc::ClientContext*,
                                                           const v1::KvRequest&, v1::KvResponse*),
      const v1::KvRequest& request, absl::Duration timeout) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
    {
      absl::MutexLock lock(&mu_);
      if (!aborted_.ok()) return aborted_;
      in_flight_.insert(&ctx);
    }
    v1::KvResponse response;
    grpc::Status s = (stub_.get()->*method)(&ctx, request, &response);
    {
      absl::MutexLock lock(&mu_);
      in_flight_.erase(&ctx);
      if (!aborted_.ok()) return aborted_;
    }
    if (!s.ok()) {
      const absl::Status status = rpc::ToAbslStatus(s);
      return absl::Status(status.code(),
                          absl::StrCat("rendezvous through the coordinator: ", status.message()));
    }
    return response;
  }

  absl::Status Aborted() {
    absl::MutexLock lock(&mu_);
    return aborted_;
  }

  std::shared_ptr<v1::CoordinatorService::Stub> stub_;
  std::string job_id_;
  int generation_;
  absl::Mutex mu_;
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
  std::set<grpc::ClientContext*> in_flight_ ABSL_GUARDED_BY(mu_);  // cancelled by Abort
};

}  // namespace

std::shared_ptr<rendezvous::KeyValueStore> MakeCoordinatorStore(
    std::shared_ptr<v1::CoordinatorService::Stub> coordinator, std::string job_id, int generation) {
  return std::make_shared<CoordinatorStore>(std::move(coordinator), std::move(job_id), generation);
}

}  // namespace pipetrain::worker
