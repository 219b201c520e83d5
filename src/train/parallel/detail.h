// src/train/parallel/detail.h — what the runtime's files share (private to src/train/parallel):
// handles through the autograd context, the FSDP unit of a parameter (plan.cpp), TP's gather of
// wte / lm_head (tp.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <string>

#include "dion/comm/group.h"
#include "dion/train/fsdp.h"
#include "dion/train/layout.h"

namespace dion::train::detail {

// Groups and runtimes travel through the autograd context as integers (they outlive every
// backward pass of their model).
inline int64_t to_handle(comm::Group* g) { return int64_t(reinterpret_cast<intptr_t>(g)); }
inline comm::Group& from_handle(const at::IValue& v) { return *reinterpret_cast<comm::Group*>(intptr_t(v.toInt())); }
inline Fsdp& fsdp_of(const at::IValue& v) { return *reinterpret_cast<Fsdp*>(intptr_t(v.toInt())); }

// The key of a parameter (its TensorImpl, as Placements') through the autograd context.
inline int64_t key_handle(const at::Tensor& param) {
  return int64_t(reinterpret_cast<intptr_t>(param.unsafeGetTensorImpl()));
}
inline const void* from_key(const at::IValue& v) { return reinterpret_cast<const void*>(intptr_t(v.toInt())); }

// The FSDP unit a parameter belongs to: "transformer.h.<i>." for a block's, else its own name.
std::string unit_of(const std::string& name);

// `w` (this rank's tp rows of wte / lm_head) gathered over `tp` for replicated compute; its
// backward keeps this rank's chunk of the gradient.
at::Tensor tp_gathered(comm::Group& tp, const at::Tensor& w, const Placement& pl);

}  // namespace dion::train::detail
