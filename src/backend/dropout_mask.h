// Dropout's mask (and NEFTune's noise), the same on every backend: element i of a call is kept when a
// counter-based hash (SplitMix64) of (seed, i) clears p, at 24-bit resolution. No generator state: the
// backward applies the same mask again from the seed, and a resumed run draws exactly what the uninterrupted
// one did.
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

// 24 random bits of element i of a call: SplitMix64 of (seed, i).
ANVIL_HOST_DEVICE inline uint32_t counter_bits24(uint64_t seed, uint64_t i) {
    uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return uint32_t(z >> 40);
}

ANVIL_HOST_DEVICE inline bool dropout_keep(uint64_t seed, uint64_t i, uint32_t threshold) {
    return counter_bits24(seed, i) >= threshold;
}

// Element i's draw from U[-1, 1) (NEFTune's noise): the same hash, (bits + 0.5) / 2^23 - 1, exact in f32 and
// symmetric about 0.
ANVIL_HOST_DEVICE inline float counter_uniform_pm1(uint64_t seed, uint64_t i) {
    return (float(counter_bits24(seed, i)) + 0.5f) * (1.0f / 8388608.0f) - 1.0f;
}

// The seed of one dropout site of a pass (the embeddings, one residual branch of one layer): every site its
// own mask, unrelated to the others'.
ANVIL_HOST_DEVICE inline uint64_t dropout_site_seed(uint64_t pass_seed, uint64_t site) {
    uint64_t z = pass_seed ^ ((site + 1) * 0xd1b54a32d192ed03ull);
    z = (z ^ (z >> 31)) * 0x7fb5d329728ea185ull;
    z = (z ^ (z >> 27)) * 0x81dadef4bc2dd44dull;
    return z ^ (z >> 33);
}

// Dropout on the attention probabilities (nanoGPT's and Hugging Face's attention dropout): P =
// softmax(scores) becomes P * keep / (1 - p) where it multiplies the values, and the softmax's backward takes
// the gradient of P through the same mask. Element (b, h, i, j) (sequence b, query head h, query i, key j <=
// i, sequences of T) is kept when dropout_keep(dropout_site_seed(seed, head0 + h), (b T + i) T + j) holds: a
// mask per head, the head numbered across tensor-parallel ranks (head0: this rank's first), so a split model
// draws what the whole one does. p = 0: no dropout (the seed unused).
struct AttnDropout {
    float p = 0.0f;
    uint64_t seed = 0;
    int head0 = 0;

    bool on() const { return p > 0.0f; }
    ANVIL_HOST_DEVICE uint64_t head_seed(int h) const { return dropout_site_seed(seed, uint64_t(head0 + h)); }
    ANVIL_HOST_DEVICE static uint64_t index(int b, int i, int j, int T) {
        return (uint64_t(b) * uint64_t(T) + uint64_t(i)) * uint64_t(T) + uint64_t(j);
    }
};

// An AttnDropout with what each element's test needs worked out once, on the host: the threshold and the
// kept probabilities' scale. factor(): what probability (b, i, j) of the head whose seed is `head_seed`
// (head_seed(h)) is multiplied by: 1 / (1 - p) kept, 0 dropped, 1 without dropout. Both backends' kernels
// take it by value.
struct AttnDropMask {
    AttnDropout d;
    uint32_t threshold = 0;
    float scale = 1.0f;

    AttnDropMask() = default;
    explicit AttnDropMask(const AttnDropout& x)
        : d(x), threshold(dropout_threshold(x.p)), scale(1.0f / (1.0f - x.p)) {}
    ANVIL_HOST_DEVICE bool on() const { return d.p > 0.0f; }
    ANVIL_HOST_DEVICE uint64_t head_seed(int h) const { return d.head_seed(h); }
    ANVIL_HOST_DEVICE float factor(uint64_t head_seed, int b, int i, int j, int T) const {
        if (!on()) return 1.0f;
        return dropout_keep(head_seed, AttnDropout::index(b, i, j, T), threshold) ? scale : 0.0f;
    }
};

}  // namespace anvil
