// The NCCL transport's collectives: the gradient AllReduce among the replicas of a stage (one
// grouped ncclAllReduce, ncclAvg, per tensor, in place, waited for by its PendingReduction),
// and AllGather among a group (ncclAllGather, or grouped sends and receives among some stages
// of the pipeline). See nccl_transport_impl.h.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runtime/transport/nccl/nccl_transport_impl.h"

namespace pipetrain::transport::nccl {

NcclTransport::NcclReduction::~NcclReduction() {
  if (done && QueryEvent(done.get()) != cudaSuccess) owner->Bury(std::move(tensors));
}

absl::Status NcclTransport::NcclReduction::Wait(absl::Time deadline) {
  if (!status.ok() || !done) return status;
  DeviceGuard device(owner->options_.device);
  status = owner->AwaitEvent(*owner->replicas_, done.get(), deadline, owner->ReductionWhat());
  if (!status.ok()) owner->Bury(tensors);  // the reduction may still write into them
  done.reset();
  return status;
}

absl::Status NcclTransport::AllReduceMean(std::vector<at::Tensor>& tensors, absl::Time deadline) {
  return StartAllReduceMean(tensors, deadline)->Wait(deadline);
}

std::unique_ptr<Transport::PendingReduction> NcclTransport::StartAllReduceMean(
    std::vector<at::Tensor> tensors, absl::Time deadline) {
  auto pending = std::make_unique<NcclReduction>(this, std::move(tensors));
  pending->status = StartReduction(*pending, deadline);
  return pending;
}

absl::Status NcclTransport::StartReduction(NcclReduction& reduction, absl::Time deadline) {
  if (absl::Status s = aborted(); !s.ok()) return s;
  for (size_t i = 0; i < reduction.tensors.size(); ++i) {
    const at::Tensor& t = reduction.tensors[i];
    const std::string doing = absl::StrCat("average tensor ", i, " across replicas");
    if (absl::Status s = CheckTensor(t, doing); !s.ok()) return s;
    if (!t.is_contiguous()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Self(), " cannot ", doing, ": it is not contiguous"));
    }
  }
  if (replicas_ == nullptr) return absl::OkStatus();
  DeviceGuard device(options_.device);
  const std::string what = ReductionWhat();
  const absl::Status started = [&]() -> absl::Status {
    if (absl::Status s = FollowCompute(*replicas_, what); !s.ok()) return s;
    absl::Status issued = IssueGroup(*replicas_, what, [&](ncclComm_t comm) {
      for (const at::Tensor& t : reduction.tensors) {
        if (t.numel() == 0) continue;
        const ncclResult_t r =
            ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), *NcclTypeOf(t.scalar_type()),
                          ncclAvg, comm, replicas_->stream);
        if (r != ncclSuccess) return r;
      }
      return ncclSuccess;
    });
    if (!issued.ok()) return issued;
    if (absl::Status s = AwaitLaunch(*replicas_, deadline, what); !s.ok()) return s;
    absl::StatusOr<Event> done = RecordEvent(*replicas_, what);
    if (!done.ok()) return done.status();
    reduction.done = std::move(done).value();
    return absl::OkStatus();
  }();
  if (!started.ok()) Bury(reduction.tensors);  // part of the reduction may have been enqueued
  return started;
}

absl::StatusOr<std::vector<at::Tensor>> NcclTransport::AllGather(const Group& group,
                                                                 const at::Tensor& mine,
                                                                 absl::Time deadline) {
  if (absl::Status s = aborted(); !s.ok()) return s;
  const std::string what = absl::StrCat("gathering among ", group.ToString());
  if (absl::Status s = CheckTensor(mine, "take part in " + what); !s.ok()) return s;
  const std::vector<int>& stages = group.stages();
  Channel* channel = group.replicas() ? replicas_ : pipeline_;
  int members = group.replicas() ? options_.replicas : options_.stages;
  int index = group.replicas() ? options_.replica : options_.stage;
  if (!stages.empty()) {
    const auto it = std::find(stages.begin(), stages.end(), options_.stage);
    if (it == stages.end()) {
      return absl::InvalidArgumentError(absl::StrCat(Self(), " is not one of the members ", what));
    }
    members = static_cast<int>(stages.size());
    index = static_cast<int>(it - stages.begin());
  }
  DeviceGuard device(options_.device);
  const at::Tensor input = mine.detach().contiguous();
  // One member: nothing to gather (in loopback the replicas' 1-rank communicator still runs).
  if (members == 1 && !(options_.loopback && channel != nullptr)) {
    return std::vector<at::Tensor>{input.clone()};
  }
  if (channel == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(Self(), " has no communicator for ", what));
  }
  const int64_t n = input.numel();
  std::vector<int64_t> shape = {members};
  for (int64_t d : input.sizes()) shape.push_back(d);
  const at::Tensor output = at::empty(shape, input.options());
  if (!stages.empty()) output.select(0, index).copy_(input);  // this member's own, on compute
  const ncclDataType_t type = *NcclTypeOf(input.scalar_type());
  const size_t element = input.element_size();
  const absl::Status gathered = [&]() -> absl::Status {
    if (absl::Status s = FollowCompute(*channel, what); !s.ok()) return s;
    if (n > 0) {
      absl::Status issued = IssueGroup(*channel, what, [&](ncclComm_t comm) {
        if (stages.empty()) {
          return ncclAllGather(input.data_ptr(), output.data_ptr(), n, type, comm, channel->stream);
        }
        for (size_t k = 0; k < stages.size(); ++k) {
          if (static_cast<int>(k) == index) continue;
          char* into = static_cast<char*>(output.data_ptr()) + k * n * element;
          ncclResult_t r = ncclSend(input.data_ptr(), n, type, stages[k], comm, channel->stream);
          if (r == ncclSuccess) r = ncclRecv(into, n, type, stages[k], comm, channel->stream);
          if (r != ncclSuccess) return r;
        }
        return ncclSuccess;
      });
      if (!issued.ok()) return issued;
      if (absl::Status s = AwaitLaunch(*channel, deadline, what); !s.ok()) return s;
    }
    absl::StatusOr<Event> done = RecordEvent(*channel, what);
    if (!done.ok()) return done.status();
    return AwaitEvent(*channel, done->get(), deadline, what);
  }();
  if (!gathered.ok()) {
    Bury({input, output});  // the gather may still read or write them
    return gathered;
  }
  std::vector<at::Tensor> parts;
  for (int k = 0; k < members; ++k) parts.push_back(output.select(0, k));
  return parts;
}

}  // namespace pipetrain::transport::nccl
