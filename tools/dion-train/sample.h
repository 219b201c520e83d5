// tools/dion-train/sample.h — `dion-train sample`: text from a checkpoint (sample.cpp).
#pragma once

namespace dion::train::tool {

// argv[0] is "sample". Returns the exit code; throws on bad input (main.cpp reports it).
int run_sample(int argc, char** argv);

}  // namespace dion::train::tool
