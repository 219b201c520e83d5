// tests/train/io/temp_dir.h — a fresh folder under $TMPDIR (or /tmp), removed with everything in
// it on destruction; shared by the trainio test binaries.
//
// The removal walks the tree with nftw(3), not std::filesystem::remove_all: the torch 2.11 wheel's
// libtorch.so exports its own copy of libstdc++'s std::filesystem functions (pytorch/pytorch
// #133437), and its remove_all crashes (SIGSEGV, a call through a null pointer) in any binary
// linked with it.
#pragma once

#include <ftw.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace dion::test {

class ScratchDir {
 public:
  ScratchDir() {
    const char* t = std::getenv("TMPDIR");
    std::string templ = std::string(t && *t ? t : "/tmp") + "/dion_trainio.XXXXXX";
    if (::mkdtemp(templ.data()) == nullptr) throw std::runtime_error("mkdtemp failed: " + templ);
    path_ = templ;
  }
  ~ScratchDir() {
    ::nftw(
        path_.c_str(),
        [](const char* p, const struct stat*, int, struct FTW*) {
          std::remove(p);  // best effort
          return 0;
        },
        16, FTW_DEPTH | FTW_PHYS);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace dion::test
