// threads.h — the number of threads of this process (entries of /proc/self/task), for the tests
// that show a step starts no threads (test_comm, test_dist).
#pragma once

#include <dirent.h>

namespace dion::testing {

inline int thread_count() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (const dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') ++n;
    ::closedir(d);
  }
  return n;
}

}  // namespace dion::testing
