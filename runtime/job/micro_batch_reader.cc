// MicroBatchReader (plan.h): a replica's training and held-out micro-batches, as tensors.
#include <ATen/ATen.h>

#include "runtime/job/plan.h"

namespace pipetrain::job {

data::MicroBatch MicroBatchReader::Read(int64_t j) const {
  return plan_.dataset->Read(
      plan_.sampler->SampleIds(j / micro_batches_, replica_, static_cast<int>(j % micro_batches_)));
}

data::MicroBatch MicroBatchReader::ReadEval(int64_t k) const {
  const JobPlan::HeldOut& held = plan_.held_out;
  const int64_t b = plan_.micro_batch_size;
  const int64_t first = (int64_t{replica_} * plan_.eval_batches + k) * b;
  std::vector<int64_t> ids;
  for (int64_t row = 0; row < b; ++row) ids.push_back(held.begin + (first + row) % held.count);
  return plan_.dataset->Read(ids);
}

at::Tensor MicroBatchReader::EvalInputs(int64_t k) const { return InputsOf(ReadEval(k)); }

at::Tensor MicroBatchReader::EvalTargets(int64_t k) const {
  data::MicroBatch mb = ReadEval(k);
  return at::tensor(mb.targets, at::kLong).reshape(mb.target_shape);
}

at::Tensor MicroBatchReader::Inputs(int64_t j) const { return InputsOf(Read(j)); }

at::Tensor MicroBatchReader::InputsOf(const data::MicroBatch& mb) const {
  if (!mb.input_tokens.empty()) {
    return at::tensor(mb.input_tokens, at::kLong).reshape(mb.input_shape);
  }
  return at::tensor(mb.input_values, at::kFloat).reshape(mb.input_shape).to(plan_.dtype);
}

at::Tensor MicroBatchReader::Targets(int64_t j) const {
  data::MicroBatch mb = Read(j);
  return at::tensor(mb.targets, at::kLong).reshape(mb.target_shape);
}

}  // namespace pipetrain::job
