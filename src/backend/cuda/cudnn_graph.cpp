// cuDNN's graph API: the library and the graph builder (see cudnn_graph.h).
#include "backend/cuda/cudnn_graph.h"

#if ANVIL_HAVE_CUDNN_H

#include <dlfcn.h>

#include <algorithm>
#include <mutex>

#include "core/error.h"

namespace anvil::cuda {

namespace {

// Every entry point: CudnnApi's field and the library's symbol.
// clang-format off
#define ANVIL_CUDNN_ENTRIES(X) \
    X(get_version, cudnnGetVersion) X(create, cudnnCreate) X(destroy, cudnnDestroy) \
    X(set_stream, cudnnSetStream) X(error_string, cudnnGetErrorString) X(last_error, cudnnGetLastErrorString) \
    X(create_desc, cudnnBackendCreateDescriptor) X(destroy_desc, cudnnBackendDestroyDescriptor) \
    X(set, cudnnBackendSetAttribute) X(get, cudnnBackendGetAttribute) X(finalize, cudnnBackendFinalize) \
    X(execute, cudnnBackendExecute)
// clang-format on

// The library's entry points, or why there are none.
struct Loaded {
    CudnnApi api;
    std::string why;  // empty when api is usable
};

Loaded load() {
    Loaded l;
    CudnnApi& a = l.api;
#ifdef ANVIL_CUDA_EMU
    // cuemu's stand-in (tests/cuemu/cudnn.cpp) defines the library's own symbols
#define ANVIL_BIND(field, symbol) a.field = &symbol;
    ANVIL_CUDNN_ENTRIES(ANVIL_BIND)
#undef ANVIL_BIND
#else
    void* lib = nullptr;
    std::string tried;
    // the loader's path first (PyTorch's pip package, LD_LIBRARY_PATH), then the CUDA toolkit's own copy
    for (const std::string& name :
         {std::string("libcudnn.so.9"), std::string(ANVIL_CUDA_LIB_DIR "/libcudnn.so.9")}) {
        if ((lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
        const char* e = dlerror();
        tried += (tried.empty() ? "" : "; ") + std::string(e ? e : name);
    }
    if (!lib) {
        l.why =
            "libcudnn.so.9 cannot be loaded (" + tried +
            "): install cuDNN 9 (pip install nvidia-cudnn-cu13, or NVIDIA's cudnn9 package) or put its lib "
            "directory on LD_LIBRARY_PATH";
        return l;
    }
    bool all = true;
#define ANVIL_BIND(field, symbol)                                       \
    a.field = reinterpret_cast<decltype(a.field)>(dlsym(lib, #symbol)); \
    all = all && a.field != nullptr;
    ANVIL_CUDNN_ENTRIES(ANVIL_BIND)
#undef ANVIL_BIND
    if (!all) {
        l.why = "libcudnn.so.9 lacks part of cuDNN 9's graph API: install cuDNN 9.0 or newer";
        return l;
    }
#endif
    if (a.get_version() < 90000)
        l.why = "cuDNN " + std::to_string(a.get_version()) + " is older than 9.0, whose graph API anvil uses";
    return l;
}

}  // namespace

void CudnnApi::check(cudnnStatus_t s, const char* what) const {
    if (s == CUDNN_STATUS_SUCCESS) [[likely]]
        return;
    char msg[1024] = {0};
    last_error(msg, sizeof msg);
    ::anvil::fail("cuDNN: {} failed: {}{}{}", what, error_string(s), msg[0] ? ": " : "", msg);
}

const CudnnApi* cudnn_api(std::string* why) {
    static std::once_flag once;
    static Loaded loaded;
    std::call_once(once, [] { loaded = load(); });
    if (!loaded.why.empty()) {
        if (why) *why = loaded.why;
        return nullptr;
    }
    return &loaded.api;
}

CudnnGraph::~CudnnGraph() {
    for (auto it = owned_.rbegin(); it != owned_.rend(); ++it) (void)api_.destroy_desc(*it);
}

cudnnBackendDescriptor_t CudnnGraph::make(cudnnBackendDescriptorType_t type) {
    cudnnBackendDescriptor_t d = nullptr;
    api_.check(api_.create_desc(type, &d), "creating a descriptor");
    owned_.push_back(d);
    return d;
}

void CudnnGraph::set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                     cudnnBackendAttributeType_t type, int64_t n, const void* v) {
    api_.check(api_.set(d, name, type, n, v), "setting a descriptor attribute");
}

void CudnnGraph::add_op(cudnnBackendDescriptor_t op) {
    api_.check(api_.finalize(op), "finalizing an operation");
    ops_.push_back(op);
}

CudnnTensor CudnnGraph::tensor(cudnnDataType_t type, Dims dims, Dims strides, bool is_virtual) {
    const CudnnTensor t{make(CUDNN_BACKEND_TENSOR_DESCRIPTOR), next_uid_++};
    const int64_t align = 16;  // what the tensor-core engines need
    set(t.desc, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    set(t.desc, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
    set(t.desc, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
    set(t.desc, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &t.uid);
    set(t.desc, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    set(t.desc, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    api_.check(api_.finalize(t.desc), "finalizing a tensor");
    return t;
}

CudnnTensor CudnnGraph::scalar(float value) {
    const CudnnTensor t{make(CUDNN_BACKEND_TENSOR_DESCRIPTOR), next_uid_++};
    const cudnnDataType_t type = CUDNN_DATA_FLOAT;
    const Dims ones{1, 1, 1, 1};
    const int64_t align = 16;
    const bool by_value = true, is_virtual = false;
    set(t.desc, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    set(t.desc, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, ones.data());
    set(t.desc, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, ones.data());
    set(t.desc, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &t.uid);
    set(t.desc, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    set(t.desc, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    set(t.desc, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    api_.check(api_.finalize(t.desc), "finalizing a scalar");
    scalars_.emplace_back(t.uid, value);
    return t;
}

CudnnTensor CudnnGraph::matmul(CudnnTensor a, CudnnTensor b, CudnnTensor c) {
    cudnnBackendDescriptor_t m = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    set(m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
    api_.check(api_.finalize(m), "finalizing a matmul descriptor");
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a.desc);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b.desc);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c.desc);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &m);
    add_op(op);
    return c;
}

CudnnTensor CudnnGraph::pointwise(cudnnPointwiseMode_t mode, CudnnTensor x, CudnnTensor y, CudnnTensor b,
                                  CudnnTensor t, int64_t axis, cudnnDataType_t precision) {
    cudnnBackendDescriptor_t pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &precision);
    if (axis >= 0) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    api_.check(api_.finalize(pw), "finalizing a pointwise descriptor");
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x.desc);
    if (b.desc) set(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b.desc);
    if (t.desc) set(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t.desc);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y.desc);
    add_op(op);
    return y;
}

CudnnTensor CudnnGraph::reduction(cudnnReduceTensorOp_t op_type, CudnnTensor x, CudnnTensor y) {
    cudnnBackendDescriptor_t r = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    set(r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &op_type);
    set(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
    api_.check(api_.finalize(r), "finalizing a reduction descriptor");
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x.desc);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y.desc);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r);
    add_op(op);
    return y;
}

CudnnTensor CudnnGraph::reshape(CudnnTensor x, CudnnTensor y) {
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x.desc);
    set(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y.desc);
    add_op(op);
    return y;
}

void CudnnGraph::finalize_graph(cudnnHandle_t handle) {
    ANVIL_ASSERT(graph_ == nullptr);
    graph_ = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    set(graph_, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(ops_.size()),
        ops_.data());
    // (deprecated since cuDNN 9.8, where a graph needs no handle; still what binds it to a device)
    if (handle)
        set(graph_, cudnnBackendAttributeName_t(800) /* CUDNN_ATTR_OPERATIONGRAPH_HANDLE */,
            CUDNN_TYPE_HANDLE, 1, &handle);
    api_.check(api_.finalize(graph_), "finalizing the operation graph");
}

std::string CudnnGraph::plan(cudnnHandle_t handle, bool nondeterministic_ok) {
    ANVIL_ASSERT(graph_ != nullptr);
    cudnnBackendDescriptor_t heur = make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph_);
    set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    api_.check(api_.finalize(heur), "finalizing the engine heuristic");
    int64_t count = 0;
    api_.check(
        api_.get(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
        "counting the heuristic's engines");
    if (count <= 0) return "cuDNN's heuristic offers no engine for this graph on this device";
    std::vector<cudnnBackendDescriptor_t> cfgs(static_cast<size_t>(count));
    for (auto& c : cfgs) c = make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    int64_t got = 0;
    api_.check(api_.get(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                        cfgs.data()),
               "reading the heuristic's engines");
    // each engine's numerical notes: a nondeterministic one would break anvil's bit-for-bit repeats
    std::vector<bool> deterministic(static_cast<size_t>(got), true);
    for (int64_t i = 0; i < got; i++) {
        cudnnBackendDescriptor_t engine = make(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
        int64_t n = 0;
        api_.check(api_.get(cfgs[size_t(i)], CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                            &n, &engine),
                   "reading an engine");
        std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes{};
        int64_t n_notes = 0;
        api_.check(api_.get(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                            int64_t(notes.size()), &n_notes, notes.data()),
                   "reading an engine's numerical notes");
        for (int64_t k = 0; k < n_notes; k++)
            if (notes[size_t(k)] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) deterministic[size_t(i)] = false;
    }
    std::string why;
    // the deterministic engines first; then, where allowed, the others
    for (const bool want : {true, false}) {
        if (!want && !nondeterministic_ok) break;
        for (int64_t i = 0; i < got; i++) {
            if (deterministic[size_t(i)] != want) continue;
            cudnnBackendDescriptor_t p = make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
            set(p, cudnnBackendAttributeName_t(400) /* CUDNN_ATTR_EXECUTION_PLAN_HANDLE */, CUDNN_TYPE_HANDLE,
                1, &handle);
            set(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                &cfgs[size_t(i)]);
            const cudnnStatus_t s = api_.finalize(p);
            if (s != CUDNN_STATUS_SUCCESS) {
                char msg[512] = {0};
                api_.last_error(msg, sizeof msg);
                why = std::string("no engine finalizes (the last: ") + api_.error_string(s) +
                      (msg[0] ? ": " : "") + msg + ")";
                continue;
            }
            int64_t ws = 0, n = 0;
            api_.check(api_.get(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws),
                       "reading the plan's workspace size");
            plan_ = p;
            workspace_ = size_t(ws);
            deterministic_ = want;
            return "";
        }
    }
    if (why.empty()) why = "cuDNN's heuristic offers no engine for this graph on this device";
    const auto passed_over = std::count(deterministic.begin(), deterministic.end(), false);
    if (passed_over > 0 && !nondeterministic_ok)
        why += fmt::format(
            "; {} of its {} engines are nondeterministic, which anvil passes over "
            "(ANVIL_CUDNN_NONDETERMINISTIC=1 takes them, and runs no longer repeat bit for bit)",
            passed_over, got);
    return why;
}

void CudnnGraph::execute(cudnnHandle_t handle, const std::vector<std::pair<int64_t, void*>>& ptrs,
                         void* workspace) {
    ANVIL_ASSERT(plan_ != nullptr);
    std::vector<int64_t> uids;
    std::vector<void*> data;
    for (const auto& [uid, p] : ptrs) uids.push_back(uid), data.push_back(p);
    for (auto& [uid, value] : scalars_) uids.push_back(uid), data.push_back(&value);
    // the variant pack is made for each run: its pointers change from call to call
    cudnnBackendDescriptor_t pack = nullptr;
    api_.check(api_.create_desc(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack), "creating the variant pack");
    struct Free {
        const CudnnApi& api;
        cudnnBackendDescriptor_t d;
        ~Free() { (void)api.destroy_desc(d); }
    } free_pack{api_, pack};
    set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, int64_t(uids.size()), uids.data());
    set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, int64_t(data.size()), data.data());
    set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    api_.check(api_.finalize(pack), "finalizing the variant pack");
    api_.check(api_.execute(handle, plan_, pack), "executing the plan");
}

}  // namespace anvil::cuda

#endif  // ANVIL_HAVE_CUDNN_H
