// tests/support/safetensors.h — a reader for the safetensors files holding reference vectors.
//
// Format: u64 little-endian header size N, N bytes of JSON {name: {dtype, shape, data_offsets},
// "__metadata__": {string: string}}, then the raw little-endian tensor bytes. We read F32, F64,
// BF16 and I64. Written here (about 80 lines) because Debian packages no C++ reader.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>

namespace dion::testing {

struct SafeTensors {
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, std::string> metadata;

  bool has(const std::string& name) const { return tensors.count(name) != 0; }
  const at::Tensor& at(const std::string& name) const;  // throws naming the file and tensor
  std::string path;
};

// Throws std::runtime_error naming the file and what is wrong.
SafeTensors load_safetensors(const std::string& path);

}  // namespace dion::testing
