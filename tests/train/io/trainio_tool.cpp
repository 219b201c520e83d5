// tests/train/io/trainio_tool.cpp — writes the files that tests/train/io/test_formats.py reads
// with the real Python packages (`safetensors`, `torch`, `tensorboard`), and copies a file the
// Python side wrote through our reader and writer. Test support, not a user tool.
//
//   trainio_tool safetensors-write OUT        fixed tensors of every dtype + metadata
//   trainio_tool safetensors-copy IN OUT      load_safetensors(IN) -> save_safetensors(OUT)
//   trainio_tool tensorboard-write LOGDIR     fixed scalar curves; prints the event file's path
// The fixed values are defined identically in test_formats.py. Exit 1 with the error on stderr.
#include <ATen/ATen.h>

#include <cstdio>
#include <exception>
#include <string>

#include "dion/train/safetensors.h"
#include "dion/train/tensorboard.h"

namespace {

int usage() {
  std::fprintf(stderr,
               "usage: trainio_tool safetensors-write OUT | safetensors-copy IN OUT | "
               "tensorboard-write LOGDIR\n");
  return 2;
}

// One 2x3x4 tensor per dtype, arange(24) converted from float64 (test_formats.py: same
// conversion, same torch), plus a transposed (non-contiguous) matrix, a scalar and an empty one.
void safetensors_write(const std::string& out) {
  const std::pair<const char*, at::ScalarType> types[] = {{"bool", at::kBool},
                                                          {"uint8", at::kByte},
                                                          {"int8", at::kChar},
                                                          {"int16", at::kShort},
                                                          {"uint16", at::kUInt16},
                                                          {"int32", at::kInt},
                                                          {"uint32", at::kUInt32},
                                                          {"int64", at::kLong},
                                                          {"uint64", at::kUInt64},
                                                          {"float16", at::kHalf},
                                                          {"bfloat16", at::kBFloat16},
                                                          {"float32", at::kFloat},
                                                          {"float64", at::kDouble},
                                                          {"float8_e4m3fn", at::kFloat8_e4m3fn},
                                                          {"float8_e5m2", at::kFloat8_e5m2},
                                                          {"complex64", at::kComplexFloat}};
  dion::train::NamedTensors t;
  for (const auto& [name, type] : types) {
    t.emplace_back(name, at::arange(24, at::kDouble).reshape({2, 3, 4}).to(type));
  }
  t.emplace_back("transposed", at::arange(12, at::kFloat).reshape({3, 4}).t());
  t.emplace_back("scalar", at::full({}, 3.5, at::kFloat));
  t.emplace_back("empty", at::zeros({0, 3}, at::kLong));
  dion::train::save_safetensors(out, t, {{"producer", "trainio_tool"}, {"step", "42"}});
}

void safetensors_copy(const std::string& in, const std::string& out) {
  const auto st = dion::train::load_safetensors(in);
  dion::train::save_safetensors(out, st.tensors, st.metadata);
}

// train/loss = 10 / (1 + s) and train/lr = 0.001 * s for s in 0..49; val/loss = 5 - 0.1 * s at
// s = 0, 10, ..., 40.
void tensorboard_write(const std::string& dir) {
  dion::train::EventWriter w(dir);
  for (int s = 0; s < 50; ++s) {
    w.add_scalar("train/loss", 10.0 / (1.0 + s), s);
    w.add_scalar("train/lr", 0.001 * s, s);
    if (s % 10 == 0) w.add_scalar("val/loss", 5.0 - 0.1 * s, s);
  }
  w.flush();
  std::printf("%s\n", w.path().c_str());
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "safetensors-write" && argc == 3) {
      safetensors_write(argv[2]);
    } else if (cmd == "safetensors-copy" && argc == 4) {
      safetensors_copy(argv[2], argv[3]);
    } else if (cmd == "tensorboard-write" && argc == 3) {
      tensorboard_write(argv[2]);
    } else {
      return usage();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainio_tool: %s\n", e.what());
    return 1;
  }
  return 0;
}
