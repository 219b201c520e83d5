// src/train/io/fs_util.cpp — remove_tree with nftw (fs_util.h says why not remove_all).
#include "dion/train/fs_util.h"

#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>

namespace dion::train {

namespace {
int remove_entry(const char* path, const struct stat*, int type, struct FTW*) {
  return (type == FTW_DP ? ::rmdir(path) : ::unlink(path)) == 0 ? 0 : -1;
}
}  // namespace

bool remove_tree(const std::filesystem::path& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return true;  // nothing there
  return ::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS) == 0;
}

}  // namespace dion::train
