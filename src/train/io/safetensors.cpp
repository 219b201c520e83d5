// src/train/io/safetensors.cpp — see dion/train/safetensors.h: the header's checks, reading with
// pread(2) straight into the tensors, and the atomic write (temporary file, fsync, rename).
#include "dion/train/safetensors.h"

#include <ATen/ops/empty.h>
#include <c10/core/ScalarType.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <stdexcept>
#include <sys/stat.h>
#include <unistd.h>

namespace dion::train {

namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian bytes; this code copies them as they are");

using ordered_json = nlohmann::ordered_json;

// ---------------------------------------------------------------------------- dtype names

struct DtypeName {
  const char* name;
  c10::ScalarType type;
};
constexpr DtypeName kDtypes[] = {
    {"BOOL", c10::ScalarType::Bool},
    {"U8", c10::ScalarType::Byte},
    {"I8", c10::ScalarType::Char},
    {"I16", c10::ScalarType::Short},
    {"U16", c10::ScalarType::UInt16},
    {"I32", c10::ScalarType::Int},
    {"U32", c10::ScalarType::UInt32},
    {"I64", c10::ScalarType::Long},
    {"U64", c10::ScalarType::UInt64},
    {"F16", c10::ScalarType::Half},
    {"BF16", c10::ScalarType::BFloat16},
    {"F32", c10::ScalarType::Float},
    {"F64", c10::ScalarType::Double},
    {"F8_E4M3", c10::ScalarType::Float8_e4m3fn},
    {"F8_E5M2", c10::ScalarType::Float8_e5m2},
    {"C64", c10::ScalarType::ComplexFloat},
};

std::string known_dtype_names() {
  std::string s;
  for (const auto& d : kDtypes) s += (s.empty() ? "" : ", ") + std::string(d.name);
  return s;
}

// Largest header the safetensors library accepts (its MAX_HEADER_SIZE): a bigger value is a
// corrupt file, not a reason to allocate gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

std::string errno_text(int err) { return std::strerror(err); }

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what);
}
[[noreturn]] void fail_tensor(const std::string& path, const std::string& name, const std::string& what) {
  throw std::runtime_error(path + ": tensor '" + name + "': " + what);
}

// Reads exactly `size` bytes at `offset`, or throws.
void pread_all(int fd, void* out, size_t size, uint64_t offset, const std::string& path) {
  auto* p = static_cast<char*>(out);
  while (size > 0) {
    const ssize_t n = ::pread(fd, p, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(path, "read failed: " + errno_text(errno));
    if (n == 0) fail(path, "unexpected end of file (was it truncated while being read?)");
    p += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
}

void write_all(int fd, const void* data, size_t size, const std::string& path) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(path, "write failed: " + errno_text(errno) + " (disk full?)");
    p += n;
    size -= static_cast<size_t>(n);
  }
}

// Closes a descriptor on scope exit unless released.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// ---------------------------------------------------------------------------- header checks

struct Entry {
  std::string name;
  c10::ScalarType type;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

Entry parse_entry(const std::string& path, const std::string& name, const ordered_json& v, uint64_t data_size) {
  Entry e;
  e.name = name;
  if (!v.is_object()) fail_tensor(path, name, "header entry is not a JSON object");
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!v.contains(key)) fail_tensor(path, name, std::string("header entry has no \"") + key + "\"");
  }
  const auto& dtype = v["dtype"];
  if (!dtype.is_string()) fail_tensor(path, name, "\"dtype\" is not a string");
  const std::string dt = dtype.get<std::string>();
  const auto* found =
      std::find_if(std::begin(kDtypes), std::end(kDtypes), [&](const DtypeName& d) { return dt == d.name; });
  if (found == std::end(kDtypes)) {
    fail_tensor(path, name, "unsupported dtype \"" + dt + "\" (supported: " + known_dtype_names() + ")");
  }
  e.type = found->type;

  const auto& shape = v["shape"];
  if (!shape.is_array()) fail_tensor(path, name, "\"shape\" is not an array");
  uint64_t bytes = c10::elementSize(e.type);
  for (const auto& d : shape) {
    if (!d.is_number_integer() || (!d.is_number_unsigned() && d.get<int64_t>() < 0) ||
        (d.is_number_unsigned() && d.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))) {
      fail_tensor(path, name, "\"shape\" " + shape.dump() + " has an entry that is not a non-negative integer");
    }
    const auto dim = d.get<uint64_t>();
    if (__builtin_mul_overflow(bytes, dim, &bytes)) {
      fail_tensor(path, name, "\"shape\" " + shape.dump() + " is too large");
    }
    e.shape.push_back(static_cast<int64_t>(dim));
  }

  const auto& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
    fail_tensor(path, name, "\"data_offsets\" " + off.dump() + " is not [begin, end] of two non-negative integers");
  }
  e.begin = off[0].get<uint64_t>();
  e.end = off[1].get<uint64_t>();
  if (e.begin > e.end || e.end > data_size) {
    fail_tensor(path, name,
                "\"data_offsets\" " + off.dump() + " is not a range within the data buffer of " +
                    std::to_string(data_size) + " bytes (truncated file?)");
  }
  if (e.end - e.begin != bytes) {
    fail_tensor(path, name,
                "\"data_offsets\" " + off.dump() + " span " + std::to_string(e.end - e.begin) + " bytes, but dtype " +
                    dt + " and shape " + shape.dump() + " need " + std::to_string(bytes));
  }
  return e;
}

// The ranges must tile [0, data_size) exactly, as in the safetensors library's validation.
void check_ranges(const std::string& path, std::vector<Entry>& entries, uint64_t data_size) {
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expected = 0;
  const Entry* prev = nullptr;
  for (const auto& e : entries) {
    if (e.begin < expected) {
      fail_tensor(path, e.name,
                  "bytes [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + ") overlap those of tensor '" +
                      prev->name + "' [" + std::to_string(prev->begin) + ", " + std::to_string(prev->end) + ")");
    }
    if (e.begin > expected) {
      fail_tensor(path, e.name,
                  "bytes start at " + std::to_string(e.begin) + ", leaving a gap after byte " +
                      std::to_string(expected) + " of the data buffer");
    }
    expected = e.end;
    prev = &e;
  }
  if (expected != data_size) {
    fail(path, "the tensors cover " + std::to_string(expected) + " bytes of the " + std::to_string(data_size) +
                   "-byte data buffer (trailing bytes: corrupt file?)");
  }
}

}  // namespace

// ---------------------------------------------------------------------------- public API

std::string safetensors_dtype_name(c10::ScalarType type) {
  for (const auto& d : kDtypes) {
    if (d.type == type) return d.name;
  }
  throw std::runtime_error(std::string("dtype ") + c10::toString(type) +
                           " has no safetensors name (supported: " + known_dtype_names() + ")");
}

bool SafeTensorsFile::has(const std::string& name) const {
  return std::any_of(tensors.begin(), tensors.end(), [&](const auto& t) { return t.first == name; });
}

const at::Tensor& SafeTensorsFile::at(const std::string& name) const {
  for (const auto& [n, t] : tensors) {
    if (n == name) return t;
  }
  throw std::runtime_error(path + ": no tensor named '" + name + "'");
}

SafeTensorsFile load_safetensors(const std::string& path) {
  Fd fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0) fail(path, "cannot open: " + errno_text(errno));
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) fail(path, "cannot stat: " + errno_text(errno));
  if (!S_ISREG(st.st_mode)) fail(path, "not a regular file");
  const auto size = static_cast<uint64_t>(st.st_size);

  uint64_t header_size = 0;
  if (size < 8)
    fail(path, "not a safetensors file: " + std::to_string(size) + " bytes, shorter than the 8-byte header size");
  pread_all(fd.fd, &header_size, 8, 0, path);
  if (header_size > size - 8 || header_size > kMaxHeaderBytes) {
    fail(path, "not a safetensors file (or truncated): header size " + std::to_string(header_size) +
                   " runs past the end of the " + std::to_string(size) + "-byte file");
  }
  std::string header(header_size, '\0');
  pread_all(fd.fd, header.data(), header_size, 8, path);
  const uint64_t data_start = 8 + header_size;
  const uint64_t data_size = size - data_start;

  // A repeated top-level name would silently replace the first: refuse it (depth 1 = the keys
  // of the header object).
  std::vector<std::string> seen;
  std::string duplicate;
  ordered_json j;
  try {
    j = ordered_json::parse(header, [&](int depth, ordered_json::parse_event_t ev, ordered_json& key) {
      if (depth == 1 && ev == ordered_json::parse_event_t::key) {
        const auto& k = key.get_ref<const std::string&>();
        if (std::find(seen.begin(), seen.end(), k) != seen.end() && duplicate.empty()) duplicate = k;
        seen.push_back(k);
      }
      return true;
    });
  } catch (const nlohmann::json::exception& e) {
    fail(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) fail(path, "header is not a JSON object");
  if (!duplicate.empty()) fail_tensor(path, duplicate, "named twice in the header");

  SafeTensorsFile out;
  out.path = path;
  std::vector<Entry> entries;
  for (const auto& [name, v] : j.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) fail(path, "\"__metadata__\" is not a JSON object");
      for (const auto& [k, s] : v.items()) {
        if (!s.is_string()) fail(path, "\"__metadata__\" value of '" + k + "' is not a string");
        out.metadata[k] = s.get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(path, name, v, data_size));
  }
  check_ranges(path, entries, data_size);

  out.tensors.reserve(entries.size());
  for (const auto& e : entries) {
    at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.type));  // CPU, contiguous
    const uint64_t bytes = e.end - e.begin;
    if (bytes) pread_all(fd.fd, t.data_ptr(), bytes, data_start + e.begin, path);
    if (e.type == c10::ScalarType::Bool) {
      const auto* b = static_cast<const uint8_t*>(t.data_ptr());
      for (uint64_t i = 0; i < bytes; ++i) {
        if (b[i] > 1)
          fail_tensor(path, e.name,
                      "BOOL element " + std::to_string(i) + " is byte " + std::to_string(b[i]) + ", not 0 or 1");
      }
    }
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // Header first: every check happens before anything is written.
  ordered_json header = ordered_json::object();
  if (!metadata.empty()) {
    ordered_json m = ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  std::vector<at::Tensor> cpu;
  cpu.reserve(tensors.size());
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name.empty()) fail(path, "a tensor has an empty name");
    if (name == "__metadata__") fail_tensor(path, name, "this name is reserved for the metadata");
    if (header.contains(name)) fail_tensor(path, name, "named twice");
    if (!t.defined()) fail_tensor(path, name, "undefined tensor");
    std::string dt;
    try {
      dt = safetensors_dtype_name(t.scalar_type());
    } catch (const std::runtime_error& e) {
      fail_tensor(path, name, e.what());
    }
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    const uint64_t bytes = c.nbytes();
    header[name] = {{"dtype", dt}, {"shape", c.sizes().vec()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    cpu.push_back(std::move(c));
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data buffer starts 8-aligned
  const uint64_t header_size = text.size();

  std::string tmp = path + ".tmp.XXXXXX";
  Fd fd{::mkostemp(tmp.data(), O_CLOEXEC)};
  if (fd.fd < 0) {
    fail(path,
         "cannot create a temporary file beside it: " + errno_text(errno) + " (is the folder there and writable?)");
  }
  try {
    // mkostemp creates the file 0600; give it the mode any new file of the user's would have.
    const mode_t mask = ::umask(0);
    ::umask(mask);
    ::fchmod(fd.fd, 0666 & ~mask);
    write_all(fd.fd, &header_size, 8, path);
    write_all(fd.fd, text.data(), text.size(), path);
    for (const auto& c : cpu) write_all(fd.fd, c.data_ptr(), c.nbytes(), path);
    if (::fsync(fd.fd) != 0) fail(path, "fsync failed: " + errno_text(errno));
    const int closed = ::close(fd.fd);
    fd.fd = -1;
    if (closed != 0) fail(path, "close failed: " + errno_text(errno));
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      fail(path, "cannot rename " + tmp + " to it: " + errno_text(errno));
    }
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  // Make the rename itself durable (best effort: some file systems refuse fsync on a folder).
  const auto dir = std::filesystem::path(path).parent_path();
  Fd dfd{::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (dfd.fd >= 0) ::fsync(dfd.fd);
}

}  // namespace dion::train
