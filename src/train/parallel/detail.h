// src/train/parallel/detail.h — what the files of Parallel share (private to src/train):
// mesh.cpp (the mesh, placing and sharding the model, the optimizer's Distribution),
// src/train/parallel_plan.cpp (where each GPT parameter lives, by name), fsdp.cpp (FSDP's
// gathers, prefetch, reshard and gradient reduce-scatter), tp.cpp (TP's autograd functions) and
// ddp.cpp (GradSync's buckets).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <string>

#include "dion/comm/group.h"
#include "dion/train/parallel.h"

namespace dion::train::detail {

// Groups travel through the autograd context as integers (the Parallel object outlives every
// backward pass of its model).
inline int64_t to_handle(comm::Group* g) { return int64_t(reinterpret_cast<intptr_t>(g)); }
inline comm::Group& from_handle(const at::IValue& v) { return *reinterpret_cast<comm::Group*>(intptr_t(v.toInt())); }

// The key of a parameter (its TensorImpl, as Parallel's maps) through the autograd context.
inline int64_t key_handle(const at::Tensor& param) {
  return int64_t(reinterpret_cast<intptr_t>(param.unsafeGetTensorImpl()));
}
inline const void* from_key(const at::IValue& v) { return reinterpret_cast<const void*>(intptr_t(v.toInt())); }
inline Parallel& parallel_of(const at::IValue& v) { return *reinterpret_cast<Parallel*>(intptr_t(v.toInt())); }

// The FSDP unit a parameter belongs to: "transformer.h.<i>." for a block's, else its own name
// (parallel_plan.cpp).
std::string unit_of(const std::string& name);

// `w` (this rank's tp rows of wte / lm_head) gathered over `tp` for replicated compute; its
// backward keeps this rank's chunk of the gradient (tp.cpp).
at::Tensor tp_gathered(comm::Group& tp, const at::Tensor& w, const ParamPlacement& pl);

}  // namespace dion::train::detail
