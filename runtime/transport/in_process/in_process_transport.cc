#include "runtime/transport/in_process/in_process_transport.h"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "runtime/transport/abort_latch.h"

namespace pipetrain::transport {

class InProcessHub {
 public:
  // from stage, to stage, kind, micro-batch, replica
  using Key = std::tuple<int, int, MessageKind, int64_t, int>;

  absl::Status Put(const Key& key, at::Tensor tensor) {
    absl::MutexLock lock(&mu_);
    if (absl::Status aborted = abort_.reason(); !aborted.ok()) return aborted;
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
      return abort_.latched() || mailbox_.count(key) > 0;
    };
    mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
    if (absl::Status aborted = abort_.reason(); !aborted.ok()) return aborted;
    auto it = mailbox_.find(key);
    if (it == mailbox_.end()) {
      return absl::DeadlineExceededError(
          absl::StrCat("stage ", std::get<1>(key), " timed out waiting for the ",
                       MessageKindName(std::get<2>(key)), " of micro-batch ", std::get<3>(key),
                       " from stage ", std::get<0>(key)));
    }
    at::Tensor tensor = std::move(it->second);
    mailbox_.erase(it);
    return tensor;
  }

  void Abort(const absl::Status& reason) {
    abort_.Latch(reason);
    absl::MutexLock wake(&mu_);  // its waits' conditions are evaluated again as it is released
  }

  // Call number `call` of replica `replica` of stage `stage`: Contribute() hands in
  // `tensors` (which must not change until Finish), Finish() waits for all replicas and
  // replaces them with the mean (summed in replica order).
  void Contribute(int stage, int64_t call, int replica, int replicas,
                  const std::vector<at::Tensor>& tensors) {
    absl::MutexLock lock(&mu_);
    Reduction& r = reductions_[{stage, call}];
    if (r.parts.empty()) r.parts.resize(replicas);
    r.parts[replica] = tensors;
    ++r.arrived;
  }
  absl::Status Finish(int stage, int64_t call, int replica, int replicas,
                      std::vector<at::Tensor>& tensors, absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    auto all_arrived = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return abort_.latched() || reductions_[{stage, call}].arrived >= replicas;
    };
    mu_.AwaitWithDeadline(absl::Condition(&all_arrived), deadline);
    if (absl::Status aborted = abort_.reason(); !aborted.ok()) return aborted;
    Reduction& done = reductions_[{stage, call}];
    if (done.arrived < replicas) {
      return absl::DeadlineExceededError(absl::StrCat(
          "stage ", stage, " replica ", replica, " timed out in gradient AllReduce ", call, ": ",
          replicas - done.arrived, " of ", replicas, " replicas did not arrive"));
    }
    if (done.mean.empty()) {
      for (size_t i = 0; i < tensors.size(); ++i) {
        at::Tensor sum = done.parts[0][i].clone();
        for (int k = 1; k < replicas; ++k) sum.add_(done.parts[k][i]);
        done.mean.push_back(sum.div_(replicas));
      }
    }
    for (size_t i = 0; i < tensors.size(); ++i) tensors[i].copy_(done.mean[i]);
    if (++done.left == replicas) reductions_.erase({stage, call});
    return absl::OkStatus();
  }

  // Call number `call` of a collective among `members` threads, keyed by `group` (the group
  // and whose it is): member `index` hands in `mine` and waits for every member's.
  absl::StatusOr<std::vector<at::Tensor>> Gather(const std::string& group, int64_t call, int index,
                                                 int members, at::Tensor mine, absl::Time deadline,
                                                 const std::string& who) {
    absl::MutexLock lock(&mu_);
    if (absl::Status aborted = abort_.reason(); !aborted.ok()) return aborted;
    const std::pair<std::string, int64_t> key{group, call};
    Gathering& g = gatherings_[key];
    if (g.parts.empty()) g.parts.resize(static_cast<size_t>(members));
    g.parts[static_cast<size_t>(index)] = std::move(mine);
    ++g.arrived;
    auto all_arrived = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return abort_.latched() || gatherings_[key].arrived >= members;
    };
    mu_.AwaitWithDeadline(absl::Condition(&all_arrived), deadline);
    if (absl::Status aborted = abort_.reason(); !aborted.ok()) return aborted;
    Gathering& done = gatherings_[key];
    if (done.arrived < members) {
      return absl::DeadlineExceededError(absl::StrCat(who, " timed out in collective ", call, ": ",
                                                      members - done.arrived, " of ", members,
                                                      " members did not arrive"));
    }
    std::vector<at::Tensor> parts = done.parts;
    if (++done.left == members) gatherings_.erase(key);
    return parts;
  }

 private:
  struct Gathering {
    std::vector<at::Tensor> parts;
    int arrived = 0;
    int left = 0;
  };
  struct Reduction {
    std::vector<std::vector<at::Tensor>> parts;
    std::vector<at::Tensor> mean;
    int arrived = 0;
    int left = 0;
  };
  absl::Mutex mu_;
  std::map<Key, at::Tensor> mailbox_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<int, int64_t>, Reduction> reductions_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, int64_t>, Gathering> gatherings_ ABSL_GUARDED_BY(mu_);
  AbortLatch abort_;  // read under mu_ by the waits' conditions
};

namespace {

class InProcessTransport : public Transport {
 public:
  InProcessTransport(std::shared_ptr<InProcessHub> hub, int stage, int stages, int replica,
                     int replicas)
      : hub_(std::move(hub)),
        stage_(stage),
        stages_(stages),
        replica_(replica),
        replicas_(replicas) {}
  int stage() const override { return stage_; }
  absl::Status SendMessage(int peer, MessageKind kind, int64_t micro_batch,
                           const at::Tensor& tensor) override {
    return hub_->Put({stage_, peer, kind, micro_batch, replica_}, tensor);
  }
  absl::StatusOr<at::Tensor> Recv(int peer, MessageKind kind, int64_t micro_batch,
                                  absl::Time deadline) override {
    return hub_->Take({peer, stage_, kind, micro_batch, replica_}, deadline);
  }
  absl::Status AllReduceMean(std::vector<at::Tensor>& tensors, absl::Time deadline) override {
    return StartAllReduceMean(tensors, deadline)->Wait(deadline);
  }
  std::unique_ptr<PendingReduction> StartAllReduceMean(std::vector<at::Tensor> tensors,
                                                       absl::Time deadline) override {
    if (replicas_ == 1) return Transport::StartAllReduceMean({}, deadline);
    const int64_t call = reductions_++;
    hub_->Contribute(stage_, call, replica_, replicas_, tensors);
    return std::make_unique<Pending>(this, call, std::move(tensors));
  }
  void Abort(const absl::Status& reason) override { hub_->Abort(reason); }

  // The tensor itself is handed to the other members (no copy), so each gets a clone.
  absl::StatusOr<std::vector<at::Tensor>> AllGather(const Group& group, const at::Tensor& mine,
                                                    absl::Time deadline) override {
    int index = 0, members = 0;
    std::string key;
    if (group.replicas()) {
      index = replica_;
      members = replicas_;
      key = absl::StrCat("replicas of stage ", stage_);
    } else if (group.stages().empty()) {
      index = stage_;
      members = stages_;
      key = absl::StrCat("pipeline of replica ", replica_);
    } else {
      const std::vector<int>& stages = group.stages();
      const auto it = std::find(stages.begin(), stages.end(), stage_);
      if (it == stages.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("stage ", stage_, " is not one of ", group.ToString()));
      }
      index = static_cast<int>(it - stages.begin());
      members = static_cast<int>(stages.size());
      key = absl::StrCat(group.ToString(), " of replica ", replica_);
    }
    if (members == 1) return std::vector<at::Tensor>{mine.clone()};
    const int64_t call = collectives_[key]++;
    return hub_->Gather(
        key, call, index, members, mine.clone(), deadline,
        absl::StrCat("stage ", stage_, " replica ", replica_, " (", group.ToString(), ")"));
  }

 private:
  struct Pending : public PendingReduction {
    Pending(InProcessTransport* owner, int64_t call, std::vector<at::Tensor> tensors)
        : owner(owner), call(call), tensors(std::move(tensors)) {}
    absl::Status Wait(absl::Time deadline) override {
      return owner->hub_->Finish(owner->stage_, call, owner->replica_, owner->replicas_, tensors,
                                 deadline);
    }
    InProcessTransport* owner;
    int64_t call;
    std::vector<at::Tensor> tensors;
  };

  std::shared_ptr<InProcessHub> hub_;
  int stage_, stages_, replica_, replicas_;
  int64_t reductions_ = 0;
  std::map<std::string, int64_t> collectives_;  // calls so far, by group
};

}  // namespace

std::shared_ptr<InProcessHub> MakeInProcessHub() { return std::make_shared<InProcessHub>(); }

std::unique_ptr<Transport> MakeInProcessTransport(std::shared_ptr<InProcessHub> hub, int stage,
                                                  int stages, int replica, int replicas) {
  return std::make_unique<InProcessTransport>(std::move(hub), stage, stages, replica, replicas);
}

}  // namespace pipetrain::transport
