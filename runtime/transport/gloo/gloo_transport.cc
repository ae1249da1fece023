#include "runtime/transport/gloo/gloo_transport.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "absl/strings/str_cat.h"
#include "runtime/base/signals.h"
#include "runtime/base/status_macros.h"
#include "runtime/rendezvous/c10d_store.h"
#include "runtime/transport/abort_latch.h"
#include "runtime/transport/gloo/peer_addresses.h"
#include "runtime/transport/wire_header.h"

namespace pipetrain::transport {
namespace {

// Every message starts with the wire header (wire_header.h). A payload of at most
// kInlinePayloadBytes travels inline, in the same Gloo message as its header: the receiver
// posts that message ahead with room for it, so a small message needs no round trip to ask
// for its payload (Gloo accepts a message shorter than the posted buffer, never a longer
// one). A larger payload follows as a second message on its own tag, received straight into
// its tensor.
constexpr int64_t kHeaderBytes = kWireHeaderWords * 8;
constexpr int64_t kInlinePayloadBytes = 128 << 10;
constexpr int64_t kPostedAhead = 4;  // first messages of later micro-batches posted per peer

// What is left until `deadline` for a c10d wait, rounded up to whole milliseconds, so that a
// wait that times out has really reached the deadline (and is reported as a timeout).
std::chrono::milliseconds TimeLeft(absl::Time deadline) {
  const absl::Duration left = absl::Ceil(deadline - absl::Now(), absl::Milliseconds(1));
  return std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(left)));
}

std::string FirstLine(const std::exception& e) {
  std::string what = e.what();
  return what.substr(0, what.find('\n'));
}

class GlooTransport : public Transport {
 public:
  GlooTransport(std::shared_ptr<rendezvous::KeyValueStore> store,
                c10::intrusive_ptr<c10d::ProcessGroupGloo> group,
                c10::intrusive_ptr<c10d::ProcessGroupGloo> replica_group,
                c10::intrusive_ptr<c10d::ProcessGroupGloo> pipeline_group,
                GlooTransportOptions options)
      : store_(std::move(store)),
        group_(std::move(group)),
        replica_group_(std::move(replica_group)),
        pipeline_group_(std::move(pipeline_group)),
        options_(std::move(options)),
        reaper_([this] { ReapSends(); }) {}

  int stage() const override { return options_.stage; }

  absl::Status SendMessage(int peer, MessageKind kind, int64_t micro_batch,
                           const at::Tensor& tensor) override {
    if (absl::Status s = aborted(); !s.ok()) return s;
    if (tensor.dim() > kWireMaxDims) {
      return absl::InvalidArgumentError(absl::StrCat("cannot send a tensor of ", tensor.dim(),
                                                     " dimensions (at most ", kWireMaxDims, ")"));
    }
    at::Tensor payload = tensor.detach().contiguous();
    const int64_t nbytes = payload.numel() * static_cast<int64_t>(payload.element_size());
    const bool inline_payload = nbytes <= kInlinePayloadBytes;
    at::Tensor first = at::empty({kHeaderBytes + (inline_payload ? nbytes : 0)}, at::kByte);
    WireHeader header;
    header.kind = static_cast<int64_t>(kind);
    header.micro_batch = micro_batch;
    header.dtype = static_cast<int64_t>(tensor.scalar_type());
    header.inline_payload = inline_payload;
    header.shape = tensor.sizes().vec();
    EncodeWireHeader(header, reinterpret_cast<int64_t*>(first.data_ptr<uint8_t>()));
    if (inline_payload && nbytes > 0) {
      std::memcpy(first.data_ptr<uint8_t>() + kHeaderBytes, payload.data_ptr(), nbytes);
    }
    try {
      std::lock_guard<std::mutex> lock(send_mu_);
      if (!send_error_.ok()) return send_error_;
      std::vector<at::Tensor> fv = {first};
      pending_.push_back({group_->send(fv, RankOf(peer), Tag(kind, micro_batch, false)), first});
      if (!inline_payload) {
        std::vector<at::Tensor> pv = {payload};
        pending_.push_back({group_->send(pv, RankOf(peer), Tag(kind, micro_batch, true)), payload});
      }
      send_cv_.notify_all();
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat("sending the ", MessageKindName(kind),
                                                 " of micro-batch ", micro_batch, " to ",
                                                 Describe(peer), ": ", FirstLine(e)));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<at::Tensor> Recv(int peer, MessageKind kind, int64_t micro_batch,
                                  absl::Time deadline) override {
    if (absl::Status s = aborted(); !s.ok()) return s;
    const std::string what = absl::StrCat("the ", MessageKindName(kind), " of micro-batch ",
                                          micro_batch, " from ", Describe(peer));
    // Gloo moves a message only once its receive is posted. The header of this message was
    // usually posted when an earlier one arrived; the next kPostedAhead are posted now, so
    // that a sender seldom waits for this process to ask.
    absl::StatusOr<PostedRecv> header = TakeHeaderRecv(peer, kind, micro_batch);
    if (!header.ok()) return Lost(peer, what, header.status().message());
    for (int64_t ahead = 1; ahead <= kPostedAhead; ++ahead) {
      const int64_t later = micro_batch + ahead * options_.chunks_per_rank();
      if (absl::Status s = PostHeaderRecv(peer, kind, later); !s.ok()) {
        return Lost(peer, what, s.message());
      }
    }
    if (absl::Status s = Wait(*header, peer, deadline, what); !s.ok()) return s;
    const at::Tensor& first = header->buffer[0];
    absl::StatusOr<WireHeader> h = DecodeWireHeader(
        reinterpret_cast<const int64_t*>(first.data_ptr<uint8_t>()), WireElementSize);
    if (!h.ok()) return absl::DataLossError(absl::StrCat(h.status().message(), " for ", what));
    if (h->kind != static_cast<int64_t>(kind) || h->micro_batch != micro_batch ||
        (h->inline_payload && h->payload_bytes > kInlinePayloadBytes)) {
      return absl::DataLossError(absl::StrCat("malformed header for ", what));
    }
    const std::vector<int64_t>& shape = h->shape;
    const auto options = at::TensorOptions().dtype(static_cast<at::ScalarType>(h->dtype));
    const int64_t nbytes = h->payload_bytes;
    if (h->inline_payload) {
      // The payload arrived with the header. A payload that fills most of the buffer is
      // handed out in place (the tensor keeps the buffer alive); a small one is copied out,
      // so a stashed activation does not hold on to a mostly empty buffer.
      at::Tensor buffer = first;
      void* data = buffer.data_ptr<uint8_t>() + kHeaderBytes;
      at::Tensor in_place = at::from_blob(
          data, shape, [buffer](void*) {}, options);
      return 2 * nbytes >= kInlinePayloadBytes ? in_place : in_place.clone();
    }
    PostedRecv payload;
    payload.buffer = {at::empty(shape, options)};
    try {
      payload.work = group_->recv(payload.buffer, RankOf(peer), Tag(kind, micro_batch, true));
    } catch (const std::exception& e) {
      return Lost(peer, what, FirstLine(e));
    }
    if (absl::Status s = Wait(payload, peer, deadline, what); !s.ok()) return s;
    return payload.buffer[0];
  }

  ~GlooTransport() override {
    {
      std::lock_guard<std::mutex> lock(send_mu_);
      stopping_ = true;
      // Sends still in flight (a peer that never received them) are given up.
      for (Pending& p : pending_) {
        try {
          p.work->abort();
        } catch (const std::exception&) {
        }
      }
    }
    send_cv_.notify_all();
    reaper_.join();
    // Receives posted ahead for messages that never came (the one after the last).
    for (auto& [key, posted] : header_recvs_) {
      try {
        posted.work->abort();
      } catch (const std::exception&) {
      }
    }
    // An aborted transport may have a collective still running on a process group's thread
    // (an AllReduce with a replica that hangs); destroying the group joins that thread, which
    // waits out Gloo's timeout. The groups are let go on a thread of their own instead, so
    // the stage ends (and its host can run the next one) at once.
    if (!aborted().ok()) {
      std::thread([group = std::move(group_), replicas = std::move(replica_group_),
                   pipeline = std::move(pipeline_group_)]() mutable {
        pipeline.reset();
        replicas.reset();
        group.reset();
      }).detach();
    }
  }

  absl::Status AllReduceMean(std::vector<at::Tensor>& tensors, absl::Time deadline) override {
    return StartAllReduceMean(tensors, deadline)->Wait(deadline);
  }

  // One flat buffer, one asynchronous ring AllReduce (sum); Wait() writes the sum divided by
  // the replica count back.
  std::unique_ptr<PendingReduction> StartAllReduceMean(std::vector<at::Tensor> tensors,
                                                       absl::Time deadline) override {
    if (!replica_group_ || tensors.empty()) return Transport::StartAllReduceMean({}, deadline);
    auto pending = std::make_unique<GlooReduction>(this, std::move(tensors));
    if (absl::Status s = aborted(); !s.ok()) {
      pending->error = s;
      return pending;
    }
    std::vector<at::Tensor> flat_parts;
    for (const at::Tensor& t : pending->tensors) flat_parts.push_back(t.reshape({-1}));
    pending->flat = {at::cat(flat_parts)};
    try {
      pending->work = replica_group_->allreduce(pending->flat);
    } catch (const std::exception& e) {
      pending->error = ReductionError(FirstLine(e));
    }
    return pending;
  }

  // Among the pipeline's stages (all or some), each member's tensor to every other member
  // over the pipeline's group (tagged by the calls between the pair); among the replicas,
  // Gloo's allgather on their group.
  absl::StatusOr<std::vector<at::Tensor>> AllGather(const Group& group, const at::Tensor& mine,
                                                    absl::Time deadline) override {
    if (absl::Status s = aborted(); !s.ok()) return s;
    const std::string what = absl::StrCat("gathering among ", group.ToString());
    const at::Tensor input = mine.detach().contiguous();
    if (!group.replicas()) {
      // Among the pipeline's stages each member's tensor goes straight to every other (one
      // hop; Gloo's ring allgather takes p − 1 in turn: measured, clipping's exchange cost
      // 1F1B 1.10 of its step that way against 1.05 so).
      if (!group.stages().empty()) return GatherAmongStages(group.stages(), input, deadline, what);
      std::vector<int> stages;
      for (int s = 0; s < options_.stages; ++s) stages.push_back(s);
      return GatherAmongStages(stages, input, deadline, what);
    }
    c10d::ProcessGroupGloo* pg = replica_group_.get();
    const int members = options_.replicas;
    if (members == 1 || pg == nullptr) return std::vector<at::Tensor>{input.clone()};
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int k = 0; k < members; ++k) outputs[0].push_back(at::empty_like(input));
    std::vector<at::Tensor> inputs = {input};
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = pg->allgather(outputs, inputs);
    } catch (const std::exception& e) {
      return CollectiveError(what, FirstLine(e));
    }
    PT_RETURN_IF_ERROR(WaitCollective(*work, deadline, what));
    return std::move(outputs[0]);
  }

  void Abort(const absl::Status& reason) override {
    abort_.Latch(reason);  // before the waits are woken, which then return it
    std::lock_guard<std::mutex> lock(waiting_mu_);
    for (c10d::Work* work : waiting_) {  // wakes their waits, which then return `reason`
      try {
        work->abort();
      } catch (const std::exception&) {
      }
    }
  }

  absl::Status Flush(absl::Time deadline) override {
    std::unique_lock<std::mutex> lock(send_mu_);
    while (pending_.empty() == false && send_error_.ok()) {
      if (absl::Status s = aborted(); !s.ok()) return s;
      // In slices, so that an Abort() (which the reaper sees) ends this wait too.
      const absl::Time slice = std::min(deadline, absl::Now() + absl::Milliseconds(50));
      send_cv_.wait_until(lock, absl::ToChronoTime(slice));
      if (absl::Now() >= deadline && !pending_.empty()) {
        return absl::DeadlineExceededError(
            absl::StrCat("stage ", options_.stage, ": ", pending_.size(),
                         " sent messages not delivered by the deadline"));
      }
    }
    return send_error_;
  }

 private:
  struct GlooReduction : public PendingReduction {
    GlooReduction(GlooTransport* owner, std::vector<at::Tensor> tensors)
        : owner(owner), tensors(std::move(tensors)) {}
    absl::Status Wait(absl::Time deadline) override {
      if (!error.ok() || !work) return error;
      PT_RETURN_IF_ERROR(owner->WaitCollective(*work, deadline, ""));
      // The mean lands in each tensor in one pass (no division of the flat buffer first).
      const at::Tensor replicas = at::scalar_tensor(owner->options_.replicas, flat[0].options());
      int64_t offset = 0;
      for (at::Tensor& t : tensors) {
        at::div_out(t, flat[0].narrow(0, offset, t.numel()).view_as(t), replicas);
        offset += t.numel();
      }
      return absl::OkStatus();
    }
    GlooTransport* owner;
    std::vector<at::Tensor> tensors;
    std::vector<at::Tensor> flat;
    c10::intrusive_ptr<c10d::Work> work;
    absl::Status error;
  };

  // Waits for a collective's `work` in slices, so that an Abort() ends the wait (a
  // collective's work cannot be aborted); a slice that runs out leaves the work as it was.
  // `what` names the collective in errors ("" for the gradient AllReduce).
  absl::Status WaitCollective(c10d::Work& work, absl::Time deadline, const std::string& what) {
    const auto failed = [&](const std::string& why) {
      return what.empty() ? ReductionError(why) : CollectiveError(what, why);
    };
    while (true) {
      if (absl::Status s = aborted(); !s.ok()) return s;
      const absl::Duration left = deadline - absl::Now();
      try {
        work.wait(TimeLeft(absl::Now() + std::min(left, options_.reduction_wait_slice)));
        return absl::OkStatus();
      } catch (const std::exception& e) {
        // A slice that ran out throws "Operation timed out!" even when the work completes
        // an instant later: a completed work's own wait says whether it succeeded.
        if (work.isCompleted()) {
          try {
            work.wait();
            return absl::OkStatus();
          } catch (const std::exception& error) {
            return failed(FirstLine(error));
          }
        }
        if (absl::Now() >= deadline) {
          return what.empty() ? ReductionError("timed out")
                              : absl::DeadlineExceededError(
                                    absl::StrCat("stage ", options_.stage, " replica ",
                                                 options_.replica, " timed out ", what));
        }
      }
    }
  }

  absl::Status CollectiveError(const std::string& what, const std::string& why) const {
    return absl::UnavailableError(absl::StrCat("stage ", options_.stage, " replica ",
                                               options_.replica, ": ", what, " failed: ", why));
  }

  // Each member's tensor to every other over the pipeline's group, then theirs received; the
  // tag of a pair's exchange is the number of exchanges between the two so far.
  absl::StatusOr<std::vector<at::Tensor>> GatherAmongStages(const std::vector<int>& stages,
                                                            const at::Tensor& input,
                                                            absl::Time deadline,
                                                            const std::string& what) {
    if (std::find(stages.begin(), stages.end(), options_.stage) == stages.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("stage ", options_.stage, " is not one of the members ", what));
    }
    std::vector<at::Tensor> parts(stages.size());
    if (stages.size() == 1) {
      parts[0] = input.clone();
      return parts;
    }
    if (!pipeline_group_) {
      return absl::InvalidArgumentError(
          absl::StrCat("stage ", options_.stage, ": ", what, " in a pipeline of one stage"));
    }
    std::vector<std::pair<size_t, c10::intrusive_ptr<c10d::Work>>> sends, receives;
    try {
      for (size_t k = 0; k < stages.size(); ++k) {
        if (stages[k] == options_.stage) {
          parts[k] = input.clone();
          continue;
        }
        const int tag = pair_exchanges_[stages[k]]++;
        std::vector<at::Tensor> out = {input};
        sends.emplace_back(k, pipeline_group_->send(out, stages[k], tag));
        parts[k] = at::empty_like(input);
        std::vector<at::Tensor> in = {parts[k]};
        receives.emplace_back(k, pipeline_group_->recv(in, stages[k], tag));
      }
    } catch (const std::exception& e) {
      return CollectiveError(what, FirstLine(e));
    }
    for (auto& [k, work] : receives) {
      PostedRecv posted{{parts[k]}, work};
      PT_RETURN_IF_ERROR(
          Wait(posted, stages[k], deadline,
               absl::StrCat("the part of ", what, " from ", options_.Describe(stages[k]))));
    }
    for (auto& [k, work] : sends) {
      PostedRecv posted{{input}, work};
      PT_RETURN_IF_ERROR(Wait(posted, stages[k], deadline,
                              absl::StrCat("the delivery of this stage's part of ", what, " from ",
                                           options_.Describe(stages[k]))));
    }
    return parts;
  }

  absl::Status ReductionError(const std::string& why) const {
    return absl::UnavailableError(absl::StrCat("stage ", options_.stage, " replica ",
                                               options_.replica, ": gradient AllReduce among ",
                                               options_.replicas, " replicas failed: ", why));
  }

  struct Pending {
    c10::intrusive_ptr<c10d::Work> work;
    at::Tensor keep_alive;
  };

  int RankOf(int stage) const { return options_.layout().RankOf(stage, options_.replica); }
  std::string Describe(int stage) const { return options_.Describe(stage); }
  // Distinct tags for the header and payload of every (kind, micro-batch).
  static int Tag(MessageKind kind, int64_t micro_batch, bool payload) {
    return static_cast<int>(micro_batch * (2 * kWireMessageKinds) + static_cast<int>(kind) * 2 +
                            (payload ? 1 : 0));
  }

  absl::Status aborted() { return abort_.reason(); }

  // A receive posted to Gloo: `buffer` fills when `work` completes.
  struct PostedRecv {
    std::vector<at::Tensor> buffer;
    c10::intrusive_ptr<c10d::Work> work;
  };
  using HeaderKey = std::tuple<int, MessageKind, int64_t>;  // peer, kind, micro-batch

  // REQUIRES: called from the receiving thread only (so is TakeHeaderRecv).
  absl::Status PostHeaderRecv(int peer, MessageKind kind, int64_t micro_batch) {
    const HeaderKey key{peer, kind, micro_batch};
    if (header_recvs_.count(key)) return absl::OkStatus();
    PostedRecv posted;
    posted.buffer = {at::empty({kHeaderBytes + kInlinePayloadBytes}, at::kByte)};
    try {
      posted.work = group_->recv(posted.buffer, RankOf(peer), Tag(kind, micro_batch, false));
    } catch (const std::exception& e) {
      return absl::UnavailableError(FirstLine(e));
    }
    header_recvs_.emplace(key, std::move(posted));
    return absl::OkStatus();
  }

  absl::StatusOr<PostedRecv> TakeHeaderRecv(int peer, MessageKind kind, int64_t micro_batch) {
    PT_RETURN_IF_ERROR(PostHeaderRecv(peer, kind, micro_batch));
    auto it = header_recvs_.find({peer, kind, micro_batch});
    PostedRecv posted = std::move(it->second);
    header_recvs_.erase(it);
    return posted;
  }

  absl::Status Lost(int peer, const std::string& what, absl::string_view why) const {
    return absl::UnavailableError(absl::StrCat("stage ", options_.stage, " lost ", Describe(peer),
                                               " while waiting for the ",
                                               what.substr(4, what.find(" from ") - 4), ": ", why));
  }

  // Registers `work` as waited on (Abort() wakes it); false if the transport is aborted.
  // (Under waiting_mu_, which Abort() takes after latching: a wait registered here either
  // sees the latch or is woken by that Abort().)
  bool BeginWait(c10d::Work* work) {
    std::lock_guard<std::mutex> lock(waiting_mu_);
    if (abort_.latched()) return false;
    waiting_.insert(work);
    return true;
  }
  void EndWait(c10d::Work* work) {
    std::lock_guard<std::mutex> lock(waiting_mu_);
    waiting_.erase(work);
  }

  absl::Status Wait(PostedRecv& posted, int peer, absl::Time deadline, const std::string& what) {
    if (!BeginWait(posted.work.get())) return aborted();
    try {
      const bool received = posted.work->wait(TimeLeft(deadline));
      EndWait(posted.work.get());
      if (!received) return aborted();  // woken by Abort()
      return absl::OkStatus();
    } catch (const std::exception& e) {
      EndWait(posted.work.get());
      if (absl::Status s = aborted(); !s.ok()) return s;
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("stage ", options_.stage, " timed out waiting for ", what));
      }
      return Lost(peer, what, FirstLine(e));
    }
  }

  // The reaper thread: waits for each send in order and drops it (and the tensor it kept
  // alive) once the peer has it. A c10d Gloo send reports completion only to a wait, so
  // without this every sent activation and gradient would stay in memory until Flush().
  // The wait has no deadline of its own (a Gloo send wait that times out poisons the whole
  // connection); a peer that is lost fails it, Abort() and the destructor end it.
  void ReapSends() {
    constexpr auto kUntilDone = std::chrono::hours(24 * 365);
    std::unique_lock<std::mutex> lock(send_mu_);
    while (true) {
      send_cv_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
      if (pending_.empty()) return;  // stopping
      c10::intrusive_ptr<c10d::Work> work = pending_.front().work;
      lock.unlock();
      absl::Status outcome;
      if (!BeginWait(work.get())) {
        outcome = aborted();
      } else {
        try {
          if (!work->wait(kUntilDone)) outcome = aborted();
        } catch (const std::exception& e) {
          outcome = absl::UnavailableError(absl::StrCat(
              "stage ", options_.stage, ": delivering a sent message: ", FirstLine(e)));
        }
        EndWait(work.get());
        if (absl::Status s = aborted(); !s.ok()) outcome = s;
      }
      lock.lock();
      if (!outcome.ok() && send_error_.ok() && !stopping_) send_error_ = outcome;
      pending_.pop_front();
      send_cv_.notify_all();
    }
  }

  std::shared_ptr<rendezvous::KeyValueStore> store_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> replica_group_;   // null with one replica
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pipeline_group_;  // null with one stage
  std::map<int, int> pair_exchanges_;  // GatherAmongStages' tags, by peer stage
  GlooTransportOptions options_;
  std::mutex send_mu_;
  std::condition_variable send_cv_;  // a send queued, or one delivered
  std::deque<Pending> pending_;      // sends not yet delivered, oldest first; guarded by send_mu_
  absl::Status send_error_;          // the first failed delivery; guarded by send_mu_
  bool stopping_ = false;            // guarded by send_mu_
  AbortLatch abort_;
  std::mutex waiting_mu_;
  std::set<c10d::Work*> waiting_;  // receives and sends being waited on; guarded by waiting_mu_
  std::map<HeaderKey, PostedRecv> header_recvs_;  // posted ahead; receiving thread only
  std::thread reaper_;  // ReapSends(); last, so that it starts after everything it uses
};

}  // namespace

int64_t GlooPostedReceiveBytes() { return kPostedAhead * (kHeaderBytes + kInlinePayloadBytes); }
int64_t GlooInlinePayloadBytes() { return kInlinePayloadBytes; }

absl::StatusOr<std::unique_ptr<Transport>> MakeGlooTransport(
    std::shared_ptr<rendezvous::KeyValueStore> store, const GlooTransportOptions& options) {
  IgnoreSigpipe();  // a peer that died fails a write, not this process
  c10::intrusive_ptr<c10d::Store> c10d_store =
      rendezvous::AsC10dStore(store, options.connect_timeout);
  PT_RETURN_IF_ERROR(options.Validate());
  const int world = options.layout().ranks();
  const int rank = options.rank();
  auto describe = [&options](int r) {
    return absl::StrCat("rank ", r, " (stage ", r % options.stages, ", replica ",
                        r / options.stages, ")");
  };
  // Where each rank listens, so that a failure to connect can name the peer and its address.
  if (absl::Status s = PublishListenAddress(*store, rank, options.host); !s.ok()) return s;
  absl::Status arrived =
      rendezvous::Rendezvous(*store, "gloo", rank, world, options.connect_timeout, describe);
  if (!arrived.ok()) return arrived;
  try {
    auto opts = c10d::ProcessGroupGloo::Options::create();
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(options.host));
    opts->timeout = std::chrono::milliseconds(absl::ToInt64Milliseconds(options.connect_timeout));
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("pipeline", c10d_store);
    auto group = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, world, opts);
    // The replicas of this stage: their own group, so the AllReduce involves no one else.
    c10::intrusive_ptr<c10d::ProcessGroupGloo> replica_group;
    if (options.replicas > 1) {
      auto stage_store =
          c10::make_intrusive<c10d::PrefixStore>(absl::StrCat("stage", options.stage), c10d_store);
      replica_group = c10::make_intrusive<c10d::ProcessGroupGloo>(stage_store, options.replica,
                                                                  options.replicas, opts);
    }
    // The stages of this replica's pipeline: the group of its collectives.
    c10::intrusive_ptr<c10d::ProcessGroupGloo> pipeline_group;
    if (options.stages > 1) {
      auto pipeline_store = c10::make_intrusive<c10d::PrefixStore>(
          absl::StrCat("replica", options.replica, "/pipeline"), c10d_store);
      pipeline_group = c10::make_intrusive<c10d::ProcessGroupGloo>(pipeline_store, options.stage,
                                                                   options.stages, opts);
    }
    return std::unique_ptr<Transport>(
        new GlooTransport(std::move(store), group, replica_group, pipeline_group, options));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        describe(rank), " at ", options.host, ": connecting the Gloo data plane within ",
        absl::FormatDuration(options.connect_timeout), " failed: ", FirstLine(e),
        PeersNamed(*store, FirstLine(e), rank, world, describe)));
  }
}

}  // namespace pipetrain::transport
