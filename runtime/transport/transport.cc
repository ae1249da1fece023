#include "runtime/transport/transport.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pipetrain::transport {

namespace {

class DoneReduction : public Transport::PendingReduction {
 public:
  explicit DoneReduction(absl::Status status) : status_(std::move(status)) {}
  absl::Status Wait(absl::Time) override { return status_; }

 private:
  absl::Status status_;
};

}  // namespace

int64_t WireElementSize(int64_t dtype) {
  using at::ScalarType;
  for (ScalarType carried :
       {ScalarType::Byte, ScalarType::Char, ScalarType::Short, ScalarType::Int, ScalarType::Long,
        ScalarType::Half, ScalarType::Float, ScalarType::Double, ScalarType::ComplexFloat,
        ScalarType::ComplexDouble, ScalarType::Bool, ScalarType::BFloat16}) {
    if (dtype == static_cast<int64_t>(carried)) {
      return static_cast<int64_t>(c10::elementSize(carried));
    }
  }
  return 0;
}

absl::Status Transport::Send(int peer_stage, MessageKind kind, int64_t micro_batch,
                             const at::Tensor& tensor) {
  absl::Status s = SendMessage(peer_stage, kind, micro_batch, tensor);
  if (s.ok() && tensor.defined()) {
    bytes_sent_.fetch_add(static_cast<int64_t>(tensor.numel()) * tensor.element_size(),
                          std::memory_order_relaxed);
    messages_sent_.fetch_add(1, std::memory_order_relaxed);
  }
  return s;
}

std::unique_ptr<Transport::PendingReduction> Transport::StartAllReduceMean(
    std::vector<at::Tensor> tensors, absl::Time deadline) {
  return std::make_unique<DoneReduction>(AllReduceMean(tensors, deadline));
}

const char* MessageKindName(MessageKind kind) {
  switch (kind) {
    case MessageKind::kActivation: return "activation";
    case MessageKind::kGradient: return "gradient";
    case MessageKind::kControl: return "control message";
    case MessageKind::kWeightVersion: return "weight version";
    case MessageKind::kEvalActivation: return "evaluated activation";
    case MessageKind::kEvalProgress: return "evaluation's progress";
  }
  return "message";
}

bool FlowsForward(MessageKind kind) {
  return kind != MessageKind::kGradient && kind != MessageKind::kEvalProgress;
}

bool IsEvaluation(MessageKind kind) {
  return kind == MessageKind::kEvalActivation || kind == MessageKind::kEvalProgress;
}

std::string Group::ToString() const {
  if (replicas_) return "the replicas";
  if (stages_.empty()) return "the pipeline";
  return absl::StrCat("stages ", absl::StrJoin(stages_, ", "), " of the pipeline");
}

int TransportOptions::chunks_per_rank() const {
  return model_stage_holders.empty()
             ? 1
             : static_cast<int>(model_stage_holders.size()) / std::max(1, stages);
}

std::string TransportOptions::Describe(int pipeline_stage) const {
  return absl::StrCat("stage ", pipeline_stage, " (rank ", layout().RankOf(pipeline_stage, replica),
                      ")");
}

absl::Status TransportOptions::Validate() const {
  std::vector<std::string> errors;
  if (stages < 1 || replicas < 1 || stage < 0 || stage >= stages || replica < 0 ||
      replica >= replicas) {
    errors.push_back(absl::StrCat("no stage ", stage, " of replica ", replica, " in a job of ",
                                  stages, " stages and ", replicas, " replicas"));
  }
  if (!model_stage_holders.empty()) {
    if (model_stage_holders.size() % static_cast<size_t>(std::max(1, stages)) != 0) {
      errors.push_back(absl::StrCat(model_stage_holders.size(), " model stages do not fill ",
                                    stages, " stages alike"));
    }
    for (int holder : model_stage_holders) {
      if (holder < 0 || holder >= stages) {
        errors.push_back(absl::StrCat("a model stage held by stage ", holder, " of ", stages));
        break;
      }
    }
  }
  if (errors.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(errors, "; "));
}

namespace {

// Where `member` (a stage, or a replica index) sits in the group's member order.
int MemberIndex(const Group& group, int member) {
  if (group.stages().empty()) return member;
  const auto it = std::find(group.stages().begin(), group.stages().end(), member);
  return it == group.stages().end() ? -1 : static_cast<int>(it - group.stages().begin());
}

}  // namespace

absl::Status Transport::AllReduce(const Group& group, std::vector<at::Tensor>& tensors, ReduceOp op,
                                  absl::Time deadline) {
  if (tensors.empty()) return absl::OkStatus();
  std::vector<at::Tensor> flat_parts;
  for (const at::Tensor& t : tensors) {
    if (t.scalar_type() != tensors[0].scalar_type()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stage ", stage(), ": an AllReduce among ", group.ToString(),
          " takes tensors of one "
          "dtype, given ",
          c10::toString(tensors[0].scalar_type()), " and ", c10::toString(t.scalar_type())));
    }
    flat_parts.push_back(t.reshape({-1}));
  }
  absl::StatusOr<std::vector<at::Tensor>> parts = AllGather(group, at::cat(flat_parts), deadline);
  if (!parts.ok()) return parts.status();
  at::NoGradGuard no_grad;
  at::Tensor combined = (*parts)[0].clone();
  for (size_t k = 1; k < parts->size(); ++k) {
    if (op == ReduceOp::kSum) {
      combined.add_((*parts)[k]);
    } else {
      combined = at::maximum(combined, (*parts)[k]);
    }
  }
  int64_t offset = 0;
  for (at::Tensor& t : tensors) {
    t.copy_(combined.narrow(0, offset, t.numel()).view_as(t));
    offset += t.numel();
  }
  return absl::OkStatus();
}

absl::Status Transport::Broadcast(const Group& group, std::vector<at::Tensor>& tensors, int root,
                                  absl::Time deadline) {
  const int index = MemberIndex(group, root);
  if (index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage ", stage(), ": no member ", root, " in ", group.ToString()));
  }
  // Gathered whole (each member's tensors to every other), then the root's kept: the
  // collectives carry small tensors.
  for (at::Tensor& t : tensors) {
    absl::StatusOr<std::vector<at::Tensor>> parts = AllGather(group, t.contiguous(), deadline);
    if (!parts.ok()) return parts.status();
    if (index >= static_cast<int>(parts->size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("stage ", stage(), ": no member ", root, " in ", group.ToString()));
    }
    at::NoGradGuard no_grad;
    t.copy_((*parts)[static_cast<size_t>(index)].view_as(t));
  }
  return absl::OkStatus();
}

absl::Status Transport::Barrier(const Group& group, absl::Time deadline) {
  const at::Tensor here = at::ones({1}, at::TensorOptions().dtype(at::kLong).device(device()));
  return AllGather(group, here, deadline).status();
}

std::string TensorSpec::ToString() const {
  std::string type;
  switch (dtype) {
    case at::kFloat: type = "float32"; break;
    case at::kDouble: type = "float64"; break;
    case at::kLong: type = "int64"; break;
    case at::kHalf: type = "float16"; break;
    case at::kBFloat16: type = "bfloat16"; break;
    default: type = c10::toString(dtype);
  }
  return absl::StrCat(type, "[", absl::StrJoin(shape, ", "), "]");
}

TensorSpec SpecOf(const at::Tensor& tensor) { return {tensor.sizes().vec(), tensor.scalar_type()}; }

bool Matches(const TensorSpec& spec, const at::Tensor& tensor) {
  return tensor.defined() && tensor.scalar_type() == spec.dtype &&
         tensor.sizes().vec() == spec.shape;
}

}  // namespace pipetrain::transport
