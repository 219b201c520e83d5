// src/train/model/autocast.cpp — AutocastScope (autocast.h): the model's bf16 autocast region.
// Kept apart: <ATen/autocast_mode.h> is a heavy header.
#include "dion/train/autocast.h"

#include <ATen/autocast_mode.h>

namespace dion::train {

AutocastScope::AutocastScope(c10::DeviceType device, bool enabled) : device_(device), enabled_(enabled) {
  if (!enabled_) return;
  prev_enabled_ = at::autocast::is_autocast_enabled(device_);
  prev_dtype_ = at::autocast::get_autocast_dtype(device_);
  at::autocast::set_autocast_enabled(device_, true);
  at::autocast::set_autocast_dtype(device_, at::kBFloat16);
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (!enabled_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_, prev_enabled_);
  at::autocast::set_autocast_dtype(device_, prev_dtype_);
}

std::optional<c10::ScalarType> autocast_dtype(c10::DeviceType device) {
  if (!at::autocast::is_autocast_enabled(device)) return std::nullopt;
  return at::autocast::get_autocast_dtype(device);
}

}  // namespace dion::train
