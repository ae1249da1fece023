// Mixed precision for a scope of layer work: LibTorch's autocast for the scope's device type
// with bfloat16 as its lower precision. Inside, matrix products and convolutions run in
// bfloat16 on bfloat16 copies of float32 weights (autograd carries their gradients back to
// the float32 weights), while what autocast keeps in float32 (norms, softmax, losses) stays
// float32. The cast weights are never kept beyond the outermost scope (a weight updated in
// place is never seen stale). `compute` float32 or float64: the scope does nothing.
// Thread-local, like autocast: one stage thread's scope never affects another's.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace pipetrain::model {

class MixedPrecisionScope {
 public:
  MixedPrecisionScope(c10::DeviceType device, c10::ScalarType compute);
  ~MixedPrecisionScope();
  MixedPrecisionScope(const MixedPrecisionScope&) = delete;
  MixedPrecisionScope& operator=(const MixedPrecisionScope&) = delete;

 private:
  bool active_ = false;
  c10::DeviceType device_ = c10::DeviceType::CPU;
  bool was_enabled_ = false;
  bool was_caching_ = true;
  c10::ScalarType was_dtype_ = c10::ScalarType::BFloat16;
};

// Whether autocast is on for CPU work on this thread (the fast float32 kernels stand aside).
bool MixedPrecisionOnCpu();

}  // namespace pipetrain::model
