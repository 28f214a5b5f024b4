// Deterministic random numbers: xoshiro256** seeded by SplitMix64, normals by Box-Muller. Portable (the
// standard library's distributions are not), so a seed means the same numbers everywhere. Training draws none
// across steps (initial weights come from one seeded stream, the data order is a function of the seed and
// the epoch, there is no dropout), so a checkpoint holds no generator state; whatever adds randomness to a
// step must save its stream with the checkpoint.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

namespace anvil {

class Rng {
public:
    explicit Rng(uint64_t seed = 0) { reseed(seed); }

    void reseed(uint64_t seed) {
        for (auto& w : s_) {
            seed += 0x9e3779b97f4a7c15ull;
            uint64_t z = seed;
            z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
            z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
            w = z ^ (z >> 31);
        }
    }

    uint64_t next_u64() {
        const uint64_t result = rotl(s_[1] * 5, 7) * 9;
        const uint64_t t = s_[1] << 17;
        s_[2] ^= s_[0];
        s_[3] ^= s_[1];
        s_[1] ^= s_[2];
        s_[0] ^= s_[3];
        s_[2] ^= t;
        s_[3] = rotl(s_[3], 45);
        return result;
    }
    // Uniform in [0, 1) with 53 random bits.
    double uniform() { return double(next_u64() >> 11) * 0x1.0p-53; }
    // Uniform integer in [0, n), unbiased (Lemire's method with rejection).
    uint64_t below(uint64_t n) {
        unsigned __int128 m = (unsigned __int128)next_u64() * n;
        uint64_t lo = uint64_t(m);
        if (lo < n) {
            const uint64_t threshold = (0 - n) % n;
            while (lo < threshold) {
                m = (unsigned __int128)next_u64() * n;
                lo = uint64_t(m);
            }
        }
        return uint64_t(m >> 64);
    }
    double normal() {
        double u1 = uniform();
        const double u2 = uniform();
        if (u1 < 1e-300) u1 = 1e-300;
        return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    }

private:
    static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
    std::array<uint64_t, 4> s_{};
};

}  // namespace anvil
