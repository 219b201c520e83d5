// dion/train/autocast.h — a scope with bf16 autocast on (CPU or CUDA), like Python's
// `with torch.autocast(device_type, dtype=torch.bfloat16)`; a no-op when disabled.
//
// On exit it restores the previous autocast state and, at the outermost level, clears the
// autocast weight cache (as Python's __exit__ does).
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

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

}  // namespace dion::train
