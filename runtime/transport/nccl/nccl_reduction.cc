// The NCCL transport's gradient AllReduce among the replicas of a stage: one grouped
// ncclAllReduce (ncclAvg) per tensor, in place, waited for by its PendingReduction. See
// nccl_transport_impl.h.
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

}  // namespace pipetrain::transport::nccl
