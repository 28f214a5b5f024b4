// Tensor: a non-owning view (pointer, shape, dtype, device). Storage is owned by an Arena or a Buffer.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace anvil {

enum class Device : uint8_t { CPU, CUDA };

inline const char* device_name(Device d) {
    return d == Device::CPU ? "cpu" : "cuda";
}

constexpr int kMaxDims = 4;

struct Shape {
    std::array<int64_t, kMaxDims> dims{};
    int ndim = 0;

    Shape() = default;
    Shape(std::initializer_list<int64_t> d) {
        ANVIL_ASSERT(d.size() <= size_t(kMaxDims));
        for (int64_t x : d) dims[size_t(ndim++)] = x;
    }
    int64_t operator[](int i) const { return dims[size_t(i)]; }
    int64_t numel() const {
        int64_t n = 1;
        for (int i = 0; i < ndim; i++) n *= dims[size_t(i)];
        return n;
    }
    bool operator==(const Shape& o) const {
        if (ndim != o.ndim) return false;
        for (int i = 0; i < ndim; i++)
            if (dims[size_t(i)] != o.dims[size_t(i)]) return false;
        return true;
    }
    std::string str() const;  // "(768, 2304)"
    // The dimensions as a file header lists them (safetensors).
    std::vector<int64_t> vec() const { return {dims.begin(), dims.begin() + ndim}; }
};

struct Tensor {
    void* data = nullptr;
    Shape shape;
    DType dtype = DType::F32;
    Device device = Device::CPU;

    bool empty() const { return data == nullptr; }
    int64_t numel() const { return shape.numel(); }
    size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
    int64_t dim(int i) const { return shape[i]; }

    template <typename T>
    T* ptr() const {
        return static_cast<T*>(data);
    }
    // f32 data, checked: the CPU backend's ops work on these.
    float* f32() const {
        ANVIL_ASSERT(dtype == DType::F32);
        return static_cast<float*>(data);
    }
    // Same storage seen with another shape of the same element count.
    Tensor view(Shape s) const {
        ANVIL_ASSERT(s.numel() == numel());
        Tensor t = *this;
        t.shape = s;
        return t;
    }
    // The i-th slice along the first dimension.
    Tensor slice0(int64_t i) const;
    // Elements [first, first + n) of the storage, as a 1-d tensor.
    Tensor range(size_t first, size_t n) const {
        ANVIL_ASSERT(first + n <= size_t(numel()));
        Tensor t = *this;
        t.data = static_cast<char*>(data) + first * dtype_size(dtype);
        t.shape = Shape{int64_t(n)};
        return t;
    }
};

}  // namespace anvil
