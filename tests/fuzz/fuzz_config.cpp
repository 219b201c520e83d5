// tests/fuzz/fuzz_config.cpp — libFuzzer target: dion-train's configuration parser
// (src/train/config_*.cpp: the YAML file, the --key value overrides, the checks).
//
// Input: bytes split at NUL characters. The first piece is the YAML config file's content (read
// through a memfd, as --config /proc/self/fd/N); each further piece is one command-line word.
// config_parse must either return a Config or throw ConfigError (or HelpRequested for -h /
// --help): any other exception, a crash, a leak or undefined behaviour is a finding. An accepted
// Config must survive its own dump: config_to_yaml -> config_load_yaml -> config_to_yaml is the
// same text and config_validate accepts it again (a run's config.yaml is read back on resume).
// Built by DION_FUZZ (clang), with config_*.cpp compiled in (they need yaml-cpp, CLI11 and fmt,
// not LibTorch); run by scripts/sanitize.sh for a bounded time.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "dion/train/config.h"

namespace {

int g_fd = -1;          // the memfd holding the YAML piece
std::string g_fd_path;  // /proc/self/fd/N

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "fuzz_config: %s\n", what.c_str());
  std::abort();
}

void write_yaml(std::string_view text) {
  if (ftruncate(g_fd, 0) != 0 || pwrite(g_fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size()))
    finding("cannot write the memfd");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_fd = memfd_create("fuzz_config.yaml", 0);
  if (g_fd < 0) finding("memfd_create failed");
  g_fd_path = "/proc/self/fd/" + std::to_string(g_fd);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dion::train;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> pieces;
  for (size_t start = 0;;) {
    const size_t end = bytes.find('\0', start);
    pieces.emplace_back(bytes.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  write_yaml(pieces[0]);
  std::vector<std::string> words = {"dion-train", "--config", g_fd_path};
  words.insert(words.end(), pieces.begin() + 1, pieces.end());
  std::vector<const char*> argv;
  for (const std::string& w : words) argv.push_back(w.c_str());

  Config config;
  try {
    config = config_parse(static_cast<int>(argv.size()), argv.data());
  } catch (const ConfigError&) {
    return 0;  // refused with a message: fine
  } catch (const HelpRequested&) {
    return 0;
  } catch (const std::exception& e) {
    finding(std::string("config_parse threw something other than ConfigError: ") + e.what());
  }

  // The dump of an accepted config reads back to the same config.
  const std::string dumped = config_to_yaml(config);
  write_yaml(dumped);
  Config reread;
  try {
    config_load_yaml(reread, g_fd_path);
    config_validate(reread);
  } catch (const std::exception& e) {
    finding("the dump of an accepted config is refused: " + std::string(e.what()) + "\n" + dumped);
  }
  if (config_to_yaml(reread) != dumped) finding("the dump does not read back the same:\n" + dumped);
  return 0;
}
