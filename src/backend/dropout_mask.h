// Dropout's mask, the same on every backend: element i of a call is kept when a counter-based hash
// (SplitMix64) of (seed, i) clears p, at 24-bit resolution. No generator state: the backward applies the
// same mask again from the seed, and a resumed run draws exactly what the uninterrupted one did.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define ANVIL_HOST_DEVICE __host__ __device__
#else
#define ANVIL_HOST_DEVICE
#endif

namespace anvil {

inline uint32_t dropout_threshold(float p) {
    return uint32_t(double(p) * 16777216.0);
}

ANVIL_HOST_DEVICE inline bool dropout_keep(uint64_t seed, uint64_t i, uint32_t threshold) {
    uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return uint32_t(z >> 40) >= threshold;
}

}  // namespace anvil
