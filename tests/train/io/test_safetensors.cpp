// safetensors (dion/train/safetensors.h): every dtype round trips bit for bit (values compared
// as bytes, so NaN payloads and float8 codes count too), the file layout is the format's
// (8-aligned header, tensors in the order given), the write is atomic, and every corrupt or
// inconsistent header is refused with a message naming the file and the tensor.
// The Python `safetensors` package reading our files, and our reader reading its files, is
// tests/train/io/test_formats.py.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "dion/train/safetensors.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using dion::test::ScratchDir;
using dion::train::load_safetensors;
using dion::train::NamedTensors;
using dion::train::save_safetensors;

namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_bytes(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

std::string tensor_bytes(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.nbytes());
}

// A tensor of `type` whose bytes are pseudo-random (any bit pattern, NaNs included), except
// BOOL, whose bytes must be 0 or 1.
at::Tensor random_tensor(at::ScalarType type, at::IntArrayRef shape, uint32_t seed) {
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(type));
  auto* p = static_cast<uint8_t*>(t.data_ptr());
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < t.nbytes(); ++i) {
    x = x * 1664525u + 1013904223u;
    p[i] = static_cast<uint8_t>(type == at::kBool ? (x >> 24) & 1 : x >> 24);
  }
  return t;
}

// A file built by hand: header size, header text, data bytes.
std::string file_bytes(const std::string& header, const std::string& data) {
  const uint64_t n = header.size();
  std::string out(reinterpret_cast<const char*>(&n), 8);
  return out + header + data;
}

// One header entry, "name":{"dtype":...,"shape":...,"data_offsets":...}. (A stream, not a chain
// of std::string operator+: GCC 12 reports a -Warray-bounds false positive on that here.)
std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  const std::string& offsets) {
  std::ostringstream s;
  s << '"' << name << "\":{\"dtype\":\"" << dtype << "\",\"shape\":" << shape << ",\"data_offsets\":" << offsets << '}';
  return s.str();
}

// A header object of `entries` joined by commas: "{e1,e2}" (a stream, for the same reason).
std::string header_of(std::initializer_list<std::string> entries) {
  std::ostringstream s;
  s << '{';
  for (const auto& e : entries) s << (&e == entries.begin() ? "" : ",") << e;
  s << '}';
  return s.str();
}

// load_safetensors(path) must throw, with a message holding the path and every `parts`.
void expect_load_error(const std::string& path, const std::vector<std::string>& parts) {
  try {
    load_safetensors(path);
    ADD_FAILURE() << "no error for " << path;
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(path, 0), 0u) << msg;
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

const std::vector<std::pair<std::string, at::ScalarType>> kAllDtypes = {
    {"BOOL", at::kBool},
    {"U8", at::kByte},
    {"I8", at::kChar},
    {"I16", at::kShort},
    {"U16", at::kUInt16},
    {"I32", at::kInt},
    {"U32", at::kUInt32},
    {"I64", at::kLong},
    {"U64", at::kUInt64},
    {"F16", at::kHalf},
    {"BF16", at::kBFloat16},
    {"F32", at::kFloat},
    {"F64", at::kDouble},
    {"F8_E4M3", at::kFloat8_e4m3fn},
    {"F8_E5M2", at::kFloat8_e5m2},
    {"C64", at::kComplexFloat},
};

}  // namespace

// ---------------------------------------------------------------------------- round trips

TEST(SafeTensors, EveryDtypeRoundTrips) {
  ScratchDir dir;
  NamedTensors in;
  uint32_t seed = 1;
  for (const auto& [name, type] : kAllDtypes) {
    EXPECT_EQ(dion::train::safetensors_dtype_name(type), name);
    in.emplace_back(name + "/matrix", random_tensor(type, {3, 5}, seed++));
    in.emplace_back(name + "/scalar", random_tensor(type, {}, seed++));
    in.emplace_back(name + "/empty", random_tensor(type, {0, 4}, seed++));
  }
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"config", "{\"a\": 1}"}};
  const std::string path = dir / "all.safetensors";
  save_safetensors(path, in, meta);
  const auto out = load_safetensors(path);
  EXPECT_EQ(out.path, path);
  EXPECT_EQ(out.metadata, meta);
  ASSERT_EQ(out.tensors.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    SCOPED_TRACE(in[i].first);
    EXPECT_EQ(out.tensors[i].first, in[i].first);  // order kept
    const at::Tensor& t = out.tensors[i].second;
    EXPECT_EQ(t.scalar_type(), in[i].second.scalar_type());
    EXPECT_EQ(t.sizes(), in[i].second.sizes());
    EXPECT_TRUE(t.is_contiguous());
    EXPECT_EQ(tensor_bytes(t), tensor_bytes(in[i].second));
  }
  EXPECT_TRUE(out.has("F32/matrix"));
  EXPECT_FALSE(out.has("nope"));
  EXPECT_EQ(tensor_bytes(out.at("I64/matrix")), tensor_bytes(in[21].second));
  try {
    out.at("nope");
    ADD_FAILURE();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(path + ": no tensor named 'nope'"), std::string::npos);
  }
}

TEST(SafeTensors, LayoutAndStrides) {
  ScratchDir dir;
  const at::Tensor base = at::arange(12, at::kFloat).reshape({3, 4});
  const at::Tensor transposed = base.t();  // non-contiguous: stored as its values, row-major
  const std::string path = dir / "a.safetensors";
  save_safetensors(path, {{"z", base}, {"a", transposed}});
  const std::string bytes = read_bytes(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);  // the data buffer starts 8-aligned
  EXPECT_EQ(bytes.size(), 8 + n + 2 * 12 * 4);
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.find("\"__metadata__\""), std::string::npos);  // none given, none written
  EXPECT_LT(header.find("\"z\""), header.find("\"a\""));
  const auto out = load_safetensors(path);
  EXPECT_EQ(out.tensors[0].first, "z");
  EXPECT_TRUE(at::equal(out.at("a"), transposed));
  EXPECT_TRUE(out.metadata.empty());
}

TEST(SafeTensors, SaveReplacesAtomicallyAndLeavesNoTemporary) {
  ScratchDir dir;
  const std::string path = dir / "w.safetensors";
  save_safetensors(path, {{"x", at::ones({2})}});
  save_safetensors(path, {{"y", at::zeros({3})}});
  const auto out = load_safetensors(path);
  ASSERT_EQ(out.tensors.size(), 1u);
  EXPECT_EQ(out.tensors[0].first, "y");
  size_t files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path())) ++files;
  EXPECT_EQ(files, 1u);
}

// ---------------------------------------------------------------------------- save errors

TEST(SafeTensors, SaveErrorsNameTheFileAndTensor) {
  ScratchDir dir;
  const std::string path = dir / "bad.safetensors";
  auto expect_save_error = [&](const std::string& target, const NamedTensors& t,
                               const std::vector<std::string>& parts) {
    try {
      save_safetensors(target, t);
      ADD_FAILURE() << "no error";
    } catch (const std::runtime_error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind(target, 0), 0u) << msg;
      for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
    }
  };
  expect_save_error(path, {{"w", at::ones({1})}, {"w", at::ones({1})}}, {"'w'", "named twice"});
  expect_save_error(path, {{"", at::ones({1})}}, {"empty name"});
  expect_save_error(path, {{"__metadata__", at::ones({1})}}, {"reserved"});
  expect_save_error(path, {{"c", at::ones({1}, at::kComplexDouble)}}, {"'c'", "ComplexDouble", "F32"});
  expect_save_error(path, {{"u", at::Tensor()}}, {"'u'", "undefined"});
  expect_save_error(dir / "no/such/folder/x.safetensors", {{"x", at::ones({1})}}, {"cannot create a temporary"});
  // Nothing was written, not even a temporary.
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

// ---------------------------------------------------------------------------- load errors

TEST(SafeTensors, CorruptFilesAreRefused) {
  ScratchDir dir;
  const std::string p = dir / "c.safetensors";
  const std::string f32x2(8, '\0');  // two F32 zeros
  // A header with one F32 entry "w" over the 8 data bytes, varied one field at a time.
  auto one = [&](const std::string& dtype, const std::string& shape, const std::string& offsets) {
    return file_bytes(header_of({entry("w", dtype, shape, offsets)}), f32x2);
  };
  struct Case {
    std::string bytes;
    std::vector<std::string> parts;  // all in the message, after the path
  };
  const std::vector<Case> cases = {
      {"abc", {"shorter than the 8-byte header size"}},
      {file_bytes("{}", "").substr(0, 8) + "{", {"header size 2 runs past the end"}},  // 1 of 2
      {file_bytes("{\"a\":", ""), {"not valid JSON"}},
      {file_bytes("[1,2]", ""), {"not a JSON object"}},
      {file_bytes("{\"w\":3}", ""), {"tensor 'w'", "not a JSON object"}},
      {file_bytes("{\"w\":{\"shape\":[2],\"data_offsets\":[0,8]}}", f32x2), {"tensor 'w'", "no \"dtype\""}},
      {one("F12", "[2]", "[0,8]"), {"tensor 'w'", "unsupported dtype \"F12\"", "BF16", "F32", "I64"}},
      {one("F32", "[-2]", "[0,8]"), {"tensor 'w'", "not a non-negative integer"}},
      {one("F32", "2", "[0,8]"), {"tensor 'w'", "\"shape\" is not an array"}},
      {one("F32", "[2]", "[0,16]"), {"tensor 'w'", "[0,16]", "not a range within the data buffer of 8 bytes"}},
      {one("F32", "[2]", "[8,0]"), {"tensor 'w'", "not a range"}},
      {one("F32", "[2]", "[0]"), {"tensor 'w'", "is not [begin, end]"}},
      {one("F32", "[3]", "[0,8]"), {"tensor 'w'", "span 8 bytes", "need 12"}},
      {one("F32", "[4611686018427387904,4]", "[0,8]"), {"tensor 'w'", "too large"}},
      {one("F32", "[1]", "[4,8]"), {"tensor 'w'", "leaving a gap"}},
      {one("F32", "[1]", "[0,4]"), {"cover 4 bytes of the 8-byte data buffer"}},
      {file_bytes(header_of({entry("a", "F32", "[2]", "[0,8]"), entry("b", "F32", "[1]", "[4,8]")}), f32x2),
       {"tensor 'b'", "overlap", "tensor 'a' [0, 8)"}},
      {file_bytes(header_of({entry("a", "F32", "[1]", "[0,4]"), entry("a", "F32", "[1]", "[4,8]")}), f32x2),
       {"tensor 'a'", "named twice"}},
      {file_bytes(header_of({"\"__metadata__\":{\"k\":1}", entry("a", "F32", "[2]", "[0,8]")}), f32x2),
       {"__metadata__", "'k'", "not a string"}},
      {file_bytes(header_of({entry("m", "BOOL", "[2]", "[0,2]")}), std::string("\x01\x02", 2)),
       {"tensor 'm'", "BOOL element 1 is byte 2"}},
  };
  expect_load_error(dir / "missing.safetensors", {"cannot open"});
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    write_bytes(p, cases[i].bytes);
    expect_load_error(p, cases[i].parts);
  }
  // A real file cut short: the last tensor's range now runs past the end.
  save_safetensors(p, {{"x", at::ones({4})}, {"y", at::ones({4})}});
  const std::string whole = read_bytes(p);
  write_bytes(p, whole.substr(0, whole.size() - 1));
  expect_load_error(p, {"tensor 'y'", "truncated file?"});
}

TEST(SafeTensors, HandMadeFileWithZeroSizeTensorsAndPadding) {
  // Zero-size tensors may share an offset; the header may be padded with spaces; the order is
  // the data order, not the header's.
  ScratchDir dir;
  const std::string p = dir / "h.safetensors";
  const float v[3] = {1.5f, -2.0f, 3.0f};
  const std::string data(reinterpret_cast<const char*>(v), sizeof v);
  write_bytes(p, file_bytes("{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]},"
                            "\"e\":{\"dtype\":\"I64\",\"shape\":[0],\"data_offsets\":[4,4]},"
                            "\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}     ",
                            data));
  const auto st = load_safetensors(p);
  ASSERT_EQ(st.tensors.size(), 3u);
  EXPECT_EQ(st.tensors[0].first, "a");
  EXPECT_EQ(st.tensors[1].first, "e");
  EXPECT_EQ(st.tensors[2].first, "b");
  EXPECT_EQ(st.at("a").item<float>(), 1.5f);
  EXPECT_EQ(st.at("e").numel(), 0);
  EXPECT_TRUE(at::equal(st.at("b"), at::tensor({-2.0f, 3.0f})));
}

// The reference vectors (written by tests/reference/make_vectors.py's own writer) all load.
TEST(SafeTensors, ReferenceVectorsLoad) {
  const fs::path dir = fs::path(DION_SOURCE_DIR) / "tests/vectors/reference";
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    const auto st = load_safetensors(e.path().string());
    EXPECT_FALSE(st.tensors.empty()) << e.path();
    EXPECT_TRUE(st.metadata.count("case")) << e.path();
    ++n;
  }
  EXPECT_GT(n, 0u);
}
