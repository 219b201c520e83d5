// tests/support/safetensors.h — the tests' name for the library's safetensors reader, which
// loads the reference vectors (tests/vectors/reference/*.safetensors).
//
// The reader itself is dion/train/safetensors.h (target dion_safetensors); this header only
// keeps the tests' spelling: dion::testing::load_safetensors(path) -> SafeTensors with
// .tensors, .metadata, .has(name) and .at(name).
#pragma once

#include "dion/train/safetensors.h"

namespace dion::testing {

using SafeTensors = dion::train::SafeTensorsFile;
using dion::train::load_safetensors;

}  // namespace dion::testing
