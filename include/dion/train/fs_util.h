// dion/train/fs_util.h — file-system helpers the trainer needs beyond <filesystem>.
//
// remove_tree: rm -rf without std::filesystem::remove_all. libtorch.so exports its own copies of
// the std::filesystem functions (from the toolchain it was built with), and they win symbol
// resolution over libstdc++'s in every program linked to it; its remove_all crashes (null call)
// with GCC 12's libstdc++. nftw() is used instead.
#pragma once

#include <filesystem>

namespace dion::train {

// Removes `path` and everything below it; a missing path is fine. Returns false if something
// could not be removed.
bool remove_tree(const std::filesystem::path& path);

}  // namespace dion::train
