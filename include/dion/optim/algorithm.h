// dion/optim/algorithm.h — the algorithm of a param group, as an enum.
//
// Strings ("muon", ...) are the API edge (dion/optim/options.h: to_string, parse_algorithm);
// inside the library only the enum is compared. Here on its own so that the hyperparameter
// rules (dion/optim/hyperparameters.h), some of which depend on the group's algorithm, can
// name it.
#pragma once

namespace dion {

enum class Algorithm { Muon, NorMuon, Dion2, NorDion2, Dion, AdamW, Lion };
inline constexpr int kAlgorithmCount = 7;

}  // namespace dion
