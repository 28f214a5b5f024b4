// anvil.Tensor: a view of anvil memory that Python holds, and the exchange protocols around it: DLPack
// (__dlpack__, the unversioned capsule PyTorch 1.13 reads and DLPack 1.0's when asked with max_version),
// __array_interface__ on the CPU, __cuda_array_interface__ on CUDA. Nothing is copied either way: an export
// hands out the pointer and keeps the storage alive until the consumer lets go; an import (from_dlpack) wraps
// the producer's memory and keeps its capsule until the anvil.Tensor dies.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include "backend/backend.h"
#include "core/tensor.h"

namespace anvil::python {

namespace py = pybind11;

struct PyTensor {
    Tensor t;
    std::shared_ptr<void> owner;  // keeps t's storage alive: a model's state, a buffer, an imported capsule
    std::shared_ptr<Backend>
        be;             // the backend the storage is on (synchronized before an export); may be null
    int device_id = 0;  // the CUDA device's ordinal

    // Waits for the work queued on the storage's device, so a consumer on another stream sees it complete.
    void sync() const {
        if (be) be->synchronize();
    }
};

// A tensor of `shape` owned by itself (a buffer from `be`), f32.
PyTensor new_tensor(const std::shared_ptr<Backend>& be, Shape shape, int device_id);

// Any object with __dlpack__ (a torch tensor, a numpy array, an anvil.Tensor) as an anvil.Tensor over the
// same memory. Row-major contiguous only; f32, bf16, f16, i32, i8 or u8; on the CPU or a CUDA device.
PyTensor tensor_from_dlpack(const py::object& obj);

void bind_tensor(py::module_& m);

}  // namespace anvil::python
