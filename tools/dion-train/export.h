// tools/dion-train/export.h — `dion-train export`: a checkpoint's weights as safetensors (export.cpp).
#pragma once

namespace dion::train::tool {

// argv[0] is "export". Returns the exit code; throws on bad input (main.cpp reports it).
int run_export(int argc, char** argv);

}  // namespace dion::train::tool
