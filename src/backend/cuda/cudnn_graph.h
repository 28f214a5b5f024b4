// cuDNN's graph API (the backend descriptors of cudnn_graph.h, cuDNN 9) for the CUDA backend's fused ops:
// the library loaded at run time (libcudnn.so.9, as PyTorch's pip packages and the CUDA toolkit ship it;
// under cuemu the emulator's stand-in, tests/cuemu/cudnn.cpp), and a small builder that turns tensors and
// operations into an operation graph, the graph into an execution plan (the heuristic's engines in order,
// nondeterministic ones refused, the first that finalizes kept), and runs the plan on a variant pack.
// Without cuDNN's headers at build time nothing here is compiled in and `cudnn_api` says so.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#if ANVIL_HAVE_CUDNN_H
#include <cudnn_graph.h>
#endif

namespace anvil::cuda {

#if ANVIL_HAVE_CUDNN_H

// The entry points anvil uses.
struct CudnnApi {
    size_t (*get_version)() = nullptr;
    cudnnStatus_t (*create)(cudnnHandle_t*) = nullptr;
    cudnnStatus_t (*destroy)(cudnnHandle_t) = nullptr;
    cudnnStatus_t (*set_stream)(cudnnHandle_t, cudaStream_t) = nullptr;
    const char* (*error_string)(cudnnStatus_t) = nullptr;
    void (*last_error)(char*, size_t) = nullptr;
    cudnnStatus_t (*create_desc)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t*) = nullptr;
    cudnnStatus_t (*destroy_desc)(cudnnBackendDescriptor_t) = nullptr;
    cudnnStatus_t (*set)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t,
                         int64_t, const void*) = nullptr;
    cudnnStatus_t (*get)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t,
                         int64_t, int64_t*, void*) = nullptr;
    cudnnStatus_t (*finalize)(cudnnBackendDescriptor_t) = nullptr;
    cudnnStatus_t (*execute)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t) = nullptr;

    // Throws naming `what`, the status and cuDNN's own account of the last error.
    void check(cudnnStatus_t s, const char* what) const;
};

// The library, loaded on the first call; null (and `why` says why) when it cannot be loaded or is older than
// cuDNN 9.
const CudnnApi* cudnn_api(std::string* why);

// A 4-D tensor of the graph: its descriptor and unique id.
struct CudnnTensor {
    cudnnBackendDescriptor_t desc = nullptr;
    int64_t uid = 0;
};

// One operation graph and, once planned, its execution plan. Tensors are 4-D (dims, strides in elements);
// the virtual ones live only inside the fused kernel. Every descriptor is owned and destroyed here.
class CudnnGraph {
public:
    using Dims = std::array<int64_t, 4>;
    explicit CudnnGraph(const CudnnApi& api) : api_(api) {}
    ~CudnnGraph();
    CudnnGraph(const CudnnGraph&) = delete;
    CudnnGraph& operator=(const CudnnGraph&) = delete;

    CudnnTensor tensor(cudnnDataType_t type, Dims dims, Dims strides, bool is_virtual);
    // an f32 scalar passed by value: the graph keeps it for the variant pack
    CudnnTensor scalar(float value);
    // c = a b over the last two dimensions (fp32 accumulation), batched over the first two
    CudnnTensor matmul(CudnnTensor a, CudnnTensor b, CudnnTensor c);
    // y = mode(x[, b[, t]]); `axis` for GEN_INDEX; `precision` the pointwise descriptor's math type
    CudnnTensor pointwise(cudnnPointwiseMode_t mode, CudnnTensor x, CudnnTensor y, CudnnTensor b = {},
                          CudnnTensor t = {}, int64_t axis = -1,
                          cudnnDataType_t precision = CUDNN_DATA_FLOAT);
    // y (x's dims with 1 where reduced) = op over x (fp32)
    CudnnTensor reduction(cudnnReduceTensorOp_t op, CudnnTensor x, CudnnTensor y);
    // y: the same memory as x seen through other dims and strides (a transposed view)
    CudnnTensor reshape(CudnnTensor x, CudnnTensor y);

    // The operation graph finalized, for `handle`'s device (null: none; cuDNN still checks shapes, types and
    // edges here, which the tests without a GPU rely on).
    void finalize_graph(cudnnHandle_t handle);
    // The execution plan for `handle`'s device (the graph finalized for it): the heuristic's engines (mode A)
    // in order, skipping those with a nondeterministic numerical note, the first that finalizes; where none
    // does and `nondeterministic_ok`, the first nondeterministic one that does. Empty when one was made, else
    // why none.
    std::string plan(cudnnHandle_t handle, bool nondeterministic_ok = false);
    bool deterministic() const { return deterministic_; }  // the plan's engine (after plan())
    size_t workspace_bytes() const { return workspace_; }
    // Runs the plan: `ptrs` maps each non-virtual, not-by-value tensor's uid to its device memory.
    void execute(cudnnHandle_t handle, const std::vector<std::pair<int64_t, void*>>& ptrs, void* workspace);

private:
    cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t type);
    void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
             int64_t n, const void* v);
    void add_op(cudnnBackendDescriptor_t op);

    const CudnnApi& api_;
    std::vector<cudnnBackendDescriptor_t> owned_;  // every descriptor made, destroyed in reverse
    std::vector<cudnnBackendDescriptor_t> ops_;
    std::vector<std::pair<int64_t, float>> scalars_;  // by-value tensors: uid, value
    cudnnBackendDescriptor_t graph_ = nullptr, plan_ = nullptr;
    int64_t next_uid_ = 1;
    size_t workspace_ = 0;
    bool deterministic_ = true;
};

#endif  // ANVIL_HAVE_CUDNN_H

}  // namespace anvil::cuda
