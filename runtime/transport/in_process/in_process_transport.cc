#include "runtime/transport/in_process/in_process_transport.h"

#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace pipetrain::transport {

class InProcessHub {
 public:
  using Key = std::tuple<int, int, MessageKind, int64_t>;  // from, to, kind, micro-batch

  absl::Status Put(const Key& key, at::Tensor tensor) {
    absl::MutexLock lock(&mu_);
    if (!abort_reason_.ok()) return abort_reason_;
    auto [it, inserted] = mailbox_.emplace(key, std::move(tensor));
    if (!inserted) {
      return absl::InternalError(absl::StrCat(
          "stage ", std::get<0>(key), " sent ", MessageKindName(std::get<2>(key)),
          " of micro-batch ", std::get<3>(key), " to stage ", std::get<1>(key), " twice"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<at::Tensor> Take(const Key& key, absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return !abort_reason_.ok() || mailbox_.count(key) > 0;
    };
    mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
    if (!abort_reason_.ok()) return abort_reason_;
    auto it = mailbox_.find(key);
    if (it == mailbox_.end()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "stage ", std::get<1>(key), " timed out waiting for the ",
          MessageKindName(std::get<2>(key)), " of micro-batch ", std::get<3>(key),
          " from stage ", std::get<0>(key)));
    }
    at::Tensor tensor = std::move(it->second);
    mailbox_.erase(it);
    return tensor;
  }

  void Abort(const absl::Status& reason) {
    absl::MutexLock lock(&mu_);
    if (abort_reason_.ok()) abort_reason_ = reason;
  }

 private:
  absl::Mutex mu_;
  std::map<Key, at::Tensor> mailbox_ ABSL_GUARDED_BY(mu_);
  absl::Status abort_reason_ ABSL_GUARDED_BY(mu_);
};

namespace {

class InProcessTransport : public Transport {
 public:
  InProcessTransport(std::shared_ptr<InProcessHub> hub, int stage)
      : hub_(std::move(hub)), stage_(stage) {}
  int stage() const override { return stage_; }
  absl::Status Send(int peer, MessageKind kind, int64_t micro_batch,
                    const at::Tensor& tensor) override {
    return hub_->Put({stage_, peer, kind, micro_batch}, tensor);
  }
  absl::StatusOr<at::Tensor> Recv(int peer, MessageKind kind, int64_t micro_batch,
                                  absl::Time deadline) override {
    return hub_->Take({peer, stage_, kind, micro_batch}, deadline);
  }
  void Abort(const absl::Status& reason) override { hub_->Abort(reason); }

 private:
  std::shared_ptr<InProcessHub> hub_;
  int stage_;
};

}  // namespace

std::shared_ptr<InProcessHub> MakeInProcessHub() { return std::make_shared<InProcessHub>(); }

std::unique_ptr<Transport> MakeInProcessTransport(std::shared_ptr<InProcessHub> hub, int stage) {
  return std::make_unique<InProcessTransport>(std::move(hub), stage);
}

}  // namespace pipetrain::transport
