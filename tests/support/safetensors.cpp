// Safetensors reader for the reference vectors (see safetensors.h).
#include "safetensors.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <fstream>
#include <stdexcept>
#include <vector>

namespace dion::testing {

const at::Tensor& SafeTensors::at(const std::string& name) const {
  auto it = tensors.find(name);
  if (it == tensors.end()) throw std::runtime_error(path + ": no tensor named '" + name + "'");
  return it->second;
}

SafeTensors load_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open");
  in.seekg(0, std::ios::end);
  const auto size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  uint64_t n = 0;
  if (size < 8 || !in.read(reinterpret_cast<char*>(&n), 8) || n > size - 8)
    throw std::runtime_error(path + ": not a safetensors file (bad header size)");
  std::string header(n, '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  std::vector<char> data(size - 8 - n);
  in.read(data.data(), static_cast<std::streamsize>(data.size()));
  if (!in) throw std::runtime_error(path + ": truncated");

  SafeTensors out;
  out.path = path;
  const auto j = nlohmann::json::parse(header);
  for (const auto& [name, v] : j.items()) {
    if (name == "__metadata__") {
      for (const auto& [k, s] : v.items()) out.metadata[k] = s.get<std::string>();
      continue;
    }
    const std::string dt = v.at("dtype").get<std::string>();
    at::ScalarType type;
    if (dt == "F32") type = at::kFloat;
    else if (dt == "F64") type = at::kDouble;
    else if (dt == "BF16") type = at::kBFloat16;
    else if (dt == "I64") type = at::kLong;
    else throw std::runtime_error(path + ": tensor '" + name + "' has unsupported dtype " + dt);
    const auto shape = v.at("shape").get<std::vector<int64_t>>();
    const auto off = v.at("data_offsets").get<std::vector<uint64_t>>();
    at::Tensor t = at::empty(shape, at::TensorOptions().dtype(type));
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    if (off.size() != 2 || off[1] - off[0] != bytes || off[1] > data.size())
      throw std::runtime_error(path + ": tensor '" + name + "' has inconsistent offsets");
    if (bytes) std::memcpy(t.data_ptr(), data.data() + off[0], bytes);
    out.tensors[name] = t;
  }
  return out;
}

}  // namespace dion::testing
