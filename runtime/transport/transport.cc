#include "runtime/transport/transport.h"

#include <ATen/ATen.h>

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
    case MessageKind::kActivation:
      return "activation";
    case MessageKind::kGradient:
      return "gradient";
    case MessageKind::kControl:
      return "control message";
    case MessageKind::kTiedGradient:
      return "tied parameter's gradient";
    case MessageKind::kWeightVersion:
      return "weight version";
    case MessageKind::kGradientNorm:
      return "part of the gradient norm";
    case MessageKind::kEvalActivation:
      return "evaluated activation";
    case MessageKind::kStepCommit:
      return "step commit";
    case MessageKind::kEvalProgress:
      return "evaluation's progress";
  }
  return "message";
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

TensorSpec SpecOf(const at::Tensor& tensor) {
  return {tensor.sizes().vec(), tensor.scalar_type()};
}

bool Matches(const TensorSpec& spec, const at::Tensor& tensor) {
  return tensor.defined() && tensor.scalar_type() == spec.dtype &&
         tensor.sizes().vec() == spec.shape;
}

}  // namespace pipetrain::transport
