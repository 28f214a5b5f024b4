// FNV-1a, the project's one non-cryptographic hash: data fingerprints, duplicate detection, the agreement
// checks between the ranks of a job. Not for anything an adversary chooses.
#pragma once

#include <cstdint>
#include <string_view>

namespace anvil {

constexpr uint64_t kFnvOffset = 1469598103934665603ull, kFnvPrime = 1099511628211ull;

// One value folded into h (a word at a time: token ids and flags, f32 bit patterns).
constexpr uint64_t fnv1a_mix(uint64_t h, uint64_t value) {
    return (h ^ value) * kFnvPrime;
}

// The bytes of s, one at a time.
constexpr uint64_t fnv1a(std::string_view s, uint64_t h = kFnvOffset) {
    for (char c : s) h = fnv1a_mix(h, uint8_t(c));
    return h;
}

}  // namespace anvil
