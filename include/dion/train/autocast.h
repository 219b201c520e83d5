// dion/train/autocast.h — a scope with bf16 autocast on (CPU or CUDA), like Python's
// `with torch.autocast(device_type, dtype=torch.bfloat16)`; a no-op when disabled.
//
// On exit it restores the previous autocast state and, at the outermost level, clears the
// autocast weight cache (as Python's __exit__ does).
// autocast_dtype(device): the dtype autocast computes in on `device` now, nullopt when it is off
// (for code that computes outside ATen's autocast lists, as dion/train/kernels.h).
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <optional>

namespace dion::train {

class AutocastScope {
 public:
  AutocastScope(c10::DeviceType device, bool enabled);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  c10::DeviceType device_;
  bool enabled_;
  bool prev_enabled_ = false;
  c10::ScalarType prev_dtype_ = c10::ScalarType::BFloat16;
};

std::optional<c10::ScalarType> autocast_dtype(c10::DeviceType device);

}  // namespace dion::train
