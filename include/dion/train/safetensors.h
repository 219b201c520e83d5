// dion/train/safetensors.h — read and write safetensors files (Hugging Face's tensor format),
// so that weights the trainer exports load in Python with `safetensors` / `torch`, and the
// reference vectors the tests compare against load in C++.
//
// Format (docs/formats.md has the details):
//     uint64 N (LE) | N bytes of JSON header | data buffer
// The header is an object {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]},
// ..., "__metadata__": {"key": "value", ...}}; offsets are relative to the data buffer, whose
// byte ranges must tile it exactly (no gaps, no overlaps), as the safetensors library demands.
// Tensors are raw little-endian, row-major.
//
// dtype names <-> LibTorch: BOOL bool, U8 uint8, I8 int8, I16 int16, U16 uint16, I32 int32,
// U32 uint32, I64 int64, U64 uint64, F16 half, BF16 bfloat16, F32 float, F64 double,
// F8_E4M3 float8_e4m3fn, F8_E5M2 float8_e5m2, C64 complex64.
//
// Written here (Debian packages no C++ safetensors library); the JSON is nlohmann-json's.
// What it is not: memory mapping or lazy loading (load reads every tensor into CPU memory),
// and no other formats. The CMake target is `dion_safetensors` (LibTorch, no optimizer code).
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace dion::train {

// Tensors with their names, in file order.
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

struct SafeTensorsFile {
  std::string path;
  NamedTensors tensors;                         // CPU, contiguous; in data-offset order
  std::map<std::string, std::string> metadata;  // "__metadata__"; empty when absent

  bool has(const std::string& name) const;
  // The tensor `name`; throws std::runtime_error naming the file and the tensor when absent.
  const at::Tensor& at(const std::string& name) const;
};

// Writes `tensors` (any device, any strides; copied to CPU contiguous) and `metadata` to
// `path` atomically: a temporary file beside it ("<path>.tmp.XXXXXX") is written, fsynced and
// renamed over `path`, so a crash leaves either the old file or the complete new one. Tensors
// are stored in the order given. Throws std::runtime_error naming the file (and the tensor)
// when a name is empty, repeated or "__metadata__", a dtype has no safetensors name, or the
// file cannot be written (the temporary is removed).
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads and checks `path`. Throws std::runtime_error naming the file, and the tensor where one
// is at fault, when: the file cannot be read; it is shorter than 8 bytes; the header size runs
// past the end of the file; the header is not a JSON object (or repeats a name); an entry lacks
// dtype / shape / data_offsets or has the wrong JSON type; a dtype is unknown (the message lists
// the known ones); a shape has a negative dimension; the offsets are not [begin <= end] within
// the data buffer; end - begin differs from the shape's byte size; two tensors' ranges overlap,
// or a gap / trailing bytes are left; a BOOL tensor holds a byte other than 0 or 1;
// __metadata__ is not an object of strings.
SafeTensorsFile load_safetensors(const std::string& path);

// The safetensors dtype name of `type` ("F32", ...); throws std::runtime_error for a type with
// none (e.g. complex128, quantized types).
std::string safetensors_dtype_name(c10::ScalarType type);

}  // namespace dion::train
