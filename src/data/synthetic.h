// The embedded default data set: instruction records for three small skills on random words of 3 to 7
// letters (reversing, sorting the letters, uppercasing), drawn from a seeded generator. No input repeats
// within a task, so held-out examples are never seen in training.
#pragma once

#include <cstdint>
#include <vector>

#include "data/dataset.h"

namespace anvil {

std::vector<Example> synthetic_examples(int n, uint64_t seed);

}  // namespace anvil
