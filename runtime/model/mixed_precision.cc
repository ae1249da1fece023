#include "runtime/model/mixed_precision.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

namespace pipetrain::model {
namespace {

// LibTorch 2.4 replaced the per-device autocast functions (is_enabled() for CUDA,
// is_cpu_enabled(), get/set_autocast_gpu_dtype(), ...) by ones taking the device type, and
// deprecated the old ones (a warning at every call); 1.13 has only the old ones.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
bool AutocastEnabled(c10::DeviceType device) { return at::autocast::is_autocast_enabled(device); }
void SetAutocastEnabled(c10::DeviceType device, bool enabled) {
  at::autocast::set_autocast_enabled(device, enabled);
}
c10::ScalarType AutocastDtype(c10::DeviceType device) {
  return at::autocast::get_autocast_dtype(device);
}
void SetAutocastDtype(c10::DeviceType device, c10::ScalarType dtype) {
  at::autocast::set_autocast_dtype(device, dtype);
}
#else
bool AutocastEnabled(c10::DeviceType device) {
  return device == c10::DeviceType::CUDA ? at::autocast::is_enabled()
                                         : at::autocast::is_cpu_enabled();
}
void SetAutocastEnabled(c10::DeviceType device, bool enabled) {
  if (device == c10::DeviceType::CUDA) {
    at::autocast::set_enabled(enabled);
  } else {
    at::autocast::set_cpu_enabled(enabled);
  }
}
c10::ScalarType AutocastDtype(c10::DeviceType device) {
  return device == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype()
                                         : at::autocast::get_autocast_cpu_dtype();
}
void SetAutocastDtype(c10::DeviceType device, c10::ScalarType dtype) {
  if (device == c10::DeviceType::CUDA) {
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
}
#endif

}  // namespace

MixedPrecisionScope::MixedPrecisionScope(c10::DeviceType device, c10::ScalarType compute) {
  if (compute != c10::ScalarType::BFloat16 && compute != c10::ScalarType::Half) return;
  active_ = true;
  device_ = device == c10::DeviceType::CUDA ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
  was_enabled_ = AutocastEnabled(device_);
  was_dtype_ = AutocastDtype(device_);
  SetAutocastDtype(device_, compute);
  SetAutocastEnabled(device_, true);
  was_caching_ = at::autocast::is_autocast_cache_enabled();
  at::autocast::set_autocast_cache_enabled(false);
  at::autocast::increment_nesting();
}

MixedPrecisionScope::~MixedPrecisionScope() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_cache_enabled(was_caching_);
  SetAutocastEnabled(device_, was_enabled_);
  SetAutocastDtype(device_, was_dtype_);
}

bool MixedPrecisionOnCpu() { return AutocastEnabled(c10::DeviceType::CPU); }

}  // namespace pipetrain::model
