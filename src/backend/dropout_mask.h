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

// The seed of one dropout site of a pass (the embeddings, one residual branch of one layer): every site its
// own mask, unrelated to the others'.
inline uint64_t dropout_site_seed(uint64_t pass_seed, uint64_t site) {
    uint64_t z = pass_seed ^ ((site + 1) * 0xd1b54a32d192ed03ull);
    z = (z ^ (z >> 31)) * 0x7fb5d329728ea185ull;
    z = (z ^ (z >> 27)) * 0x81dadef4bc2dd44dull;
    return z ^ (z >> 33);
}

}  // namespace anvil
