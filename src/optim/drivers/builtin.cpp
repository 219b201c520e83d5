// src/optim/drivers/builtin.cpp — the library's own algorithms, in the registry's listing order:
// one registration function per driver file (DION_BUILTIN_DRIVER, dion/optim/driver.h). Adding a
// driver file: list its stem here and its source in cmake/DionTorch.cmake. Calling them from
// here is also what links them out of the static library, which would otherwise drop files that
// nothing references.
#include "dion/optim/driver.h"

namespace dion::detail {

void register_driver_muon();
void register_driver_dion2();
void register_driver_dion();
void register_driver_scalar();

void register_builtin_algorithms() {
  register_driver_muon();
  register_driver_dion2();
  register_driver_dion();
  register_driver_scalar();
}

}  // namespace dion::detail
