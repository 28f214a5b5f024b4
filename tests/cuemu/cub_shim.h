// cuemu: the few cub device-wide algorithms the kernels use, on the host with the same calling convention
// (a first call with no temporary storage asks for its size; the results are what cub specifies).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <numeric>
#include <vector>

namespace cub {

inline constexpr size_t kEmuTempBytes = 256;  // any non-zero size: the caller must allocate and pass it

struct DeviceRadixSort {
    // Stable sort of (key, value) pairs by the key bits [begin_bit, end_bit).
    template <typename K, typename V>
    static cudaError_t SortPairs(void* temp, size_t& temp_bytes, const K* keys_in, K* keys_out,
                                 const V* values_in, V* values_out, int n, int begin_bit = 0,
                                 int end_bit = sizeof(K) * 8, cudaStream_t = nullptr) {
        if (temp == nullptr) return temp_bytes = kEmuTempBytes, cudaSuccess;
        if (temp_bytes < kEmuTempBytes) return cudaErrorInvalidValue;
        const unsigned long long bits =
            end_bit - begin_bit >= 64 ? ~0ull : (1ull << (end_bit - begin_bit)) - 1;
        auto key = [&](K k) { return (static_cast<unsigned long long>(k) >> begin_bit) & bits; };
        std::vector<int> order(size_t(std::max(n, 0)));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(),
                         [&](int a, int b) { return key(keys_in[a]) < key(keys_in[b]); });
        std::vector<K> k(order.size());
        std::vector<V> v(order.size());
        for (size_t i = 0; i < order.size(); i++) k[i] = keys_in[order[i]], v[i] = values_in[order[i]];
        std::copy(k.begin(), k.end(), keys_out);
        std::copy(v.begin(), v.end(), values_out);
        return cudaSuccess;
    }
};

struct DeviceRunLengthEncode {
    // Runs of equal consecutive items: each run's item, its length, and the number of runs.
    template <typename T, typename C, typename R>
    static cudaError_t Encode(void* temp, size_t& temp_bytes, const T* in, T* unique_out, C* counts_out,
                              R* num_runs_out, int n, cudaStream_t = nullptr) {
        if (temp == nullptr) return temp_bytes = kEmuTempBytes, cudaSuccess;
        R runs = 0;
        for (int i = 0; i < n;) {
            int j = i;
            while (j < n && in[j] == in[i]) j++;
            unique_out[runs] = in[i];
            counts_out[runs] = C(j - i);
            runs++;
            i = j;
        }
        *num_runs_out = runs;
        return cudaSuccess;
    }
};

struct DeviceScan {
    template <typename T, typename U>
    static cudaError_t ExclusiveSum(void* temp, size_t& temp_bytes, const T* in, U* out, int n,
                                    cudaStream_t = nullptr) {
        if (temp == nullptr) return temp_bytes = kEmuTempBytes, cudaSuccess;
        U sum{};
        for (int i = 0; i < n; i++) {
            const U x = U(in[i]);
            out[i] = sum;
            sum += x;
        }
        return cudaSuccess;
    }
};

}  // namespace cub
