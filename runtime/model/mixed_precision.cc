#include "runtime/model/mixed_precision.h"

#include <ATen/autocast_mode.h>

namespace pipetrain::model {

MixedPrecisionScope::MixedPrecisionScope(c10::DeviceType device, c10::ScalarType compute) {
  if (compute != c10::ScalarType::BFloat16 && compute != c10::ScalarType::Half) return;
  active_ = true;
  cuda_ = device == c10::DeviceType::CUDA;
  if (cuda_) {
    was_enabled_ = at::autocast::is_enabled();
    was_dtype_ = at::autocast::get_autocast_gpu_dtype();
    at::autocast::set_autocast_gpu_dtype(compute);
    at::autocast::set_enabled(true);
  } else {
    was_enabled_ = at::autocast::is_cpu_enabled();
    was_dtype_ = at::autocast::get_autocast_cpu_dtype();
    at::autocast::set_autocast_cpu_dtype(compute);
    at::autocast::set_cpu_enabled(true);
  }
  was_caching_ = at::autocast::is_autocast_cache_enabled();
  at::autocast::set_autocast_cache_enabled(false);
  at::autocast::increment_nesting();
}

MixedPrecisionScope::~MixedPrecisionScope() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_cache_enabled(was_caching_);
  if (cuda_) {
    at::autocast::set_enabled(was_enabled_);
    at::autocast::set_autocast_gpu_dtype(was_dtype_);
  } else {
    at::autocast::set_cpu_enabled(was_enabled_);
    at::autocast::set_autocast_cpu_dtype(was_dtype_);
  }
}

bool MixedPrecisionOnCpu() { return at::autocast::is_cpu_enabled(); }

}  // namespace pipetrain::model
