// cuemu's cuDNN: the graph API (the backend descriptors of cudnn_graph.h) that anvil's --attention cudnn
// uses, with the graph interpreted on the CPU, so the CUDA suite covers the code that builds and runs the
// graphs.
//
// Descriptors keep the attributes they are given; finalizing checks what cuDNN checks at that point (every
// attribute an operation needs, operands' shapes against each other, each virtual tensor produced once by an
// operation of its graph, no cycle). The heuristic offers one engine (none with CUEMU_CUDNN_NO_ENGINE=1; with
// CUEMU_CUDNN_NONDETERMINISTIC=1 a nondeterministic one first, which a caller must skip; =only that one
// alone, which a caller must refuse unless it takes nondeterministic engines), whose plan asks for a
// workspace of 1 MiB that execution requires. Execution runs the operations in dependency order:
//   matmul     C[.., m, n] = sum_k A[.., m, k] B[.., k, n] in f32, batch dimensions broadcast: a dimension of
//   1,
//              or a divisor of C's (head h of C reads head h / (C's / A's): grouped-query attention)
//   pointwise  Y = f(X, B, T) elementwise, operands broadcast the same way: ADD SUB MUL DIV MAX EXP LOG
//   IDENTITY,
//              CMP_GE (1 or 0), BINARY_SELECT (T ? X : B), GEN_INDEX (the index along AXIS)
//   reduction  Y = MAX or ADD over the X elements that map to each Y element (a dimension of 1 in Y, or a
//              divisor of X's: groups of consecutive heads)
//   reshape    Y is X's memory seen through Y's dims and strides (a transposed view)
// Every tensor's values are rounded to its data type when written (a virtual bf16 tensor holds bf16 values),
// non-virtual ones read and written through their strides in the variant pack's memory, by-value ones read
// from the host scalar the pack points at. What this cannot show: that the real library has an engine for a
// graph, or its speed; the card says that.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cudnn_graph.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "capture.h"

namespace {

thread_local std::string g_last_error;

cudnnStatus_t fail(cudnnStatus_t s, std::string msg) {
    g_last_error = std::move(msg);
    return s;
}

bool env_on(const char* name) {
    const char* v = std::getenv(name);
    return v && *v && std::string(v) != "0";
}

size_t elem_size(cudnnBackendAttributeType_t t) {
    switch (t) {
        case CUDNN_TYPE_BOOLEAN:
        case CUDNN_TYPE_CHAR:
            return 1;
        case CUDNN_TYPE_INT64:
        case CUDNN_TYPE_DOUBLE:
        case CUDNN_TYPE_VOID_PTR:
        case CUDNN_TYPE_BACKEND_DESCRIPTOR:
        case CUDNN_TYPE_HANDLE:
            return 8;
        default:
            return 4;  // enums, float, int32
    }
}

struct Attr {
    cudnnBackendAttributeType_t type;
    int64_t count = 0;
    std::vector<uint8_t> bytes;
};

struct Desc {
    cudnnBackendDescriptorType_t type;
    std::map<int, Attr> attrs;
    bool finalized = false;
    std::vector<Desc*> owned;  // descriptors this one made (a heuristic's engines), freed with it
    ~Desc() {
        for (Desc* d : owned) delete d;
    }
    bool has(int name) const { return attrs.count(name) != 0; }
    template <class T>
    std::vector<T> all(int name) const {
        std::vector<T> v;
        auto it = attrs.find(name);
        if (it == attrs.end()) return v;
        v.resize(size_t(it->second.count));
        std::memcpy(v.data(), it->second.bytes.data(), v.size() * sizeof(T));
        return v;
    }
    template <class T>
    T one(int name, T fallback = T{}) const {
        const auto v = all<T>(name);
        return v.empty() ? fallback : v[0];
    }
    Desc* desc(int name) const { return static_cast<Desc*>(one<void*>(name)); }
    void put(int name, cudnnBackendAttributeType_t t, int64_t n, const void* v) {
        Attr& a = attrs[name];
        a.type = t, a.count = n;
        a.bytes.assign(static_cast<const uint8_t*>(v), static_cast<const uint8_t*>(v) + n * elem_size(t));
    }
};

std::set<Desc*> g_live;

Desc* live(cudnnBackendDescriptor_t d) {
    auto* p = static_cast<Desc*>(d);
    return g_live.count(p) ? p : nullptr;
}

// ---- tensors -------------------------------------------------------------------------------------------

struct Tensor {
    int64_t uid = 0;
    cudnnDataType_t type = CUDNN_DATA_FLOAT;
    std::vector<int64_t> dims, strides;
    bool is_virtual = false, by_value = false;
    int nd() const { return int(dims.size()); }
    int64_t count() const {
        int64_t n = 1;
        for (int64_t d : dims) n *= d;
        return n;
    }
    int64_t offset(const int64_t* idx) const {
        int64_t o = 0;
        for (int k = 0; k < nd(); k++) o += idx[k] * strides[size_t(k)];
        return o;
    }
    int64_t span() const {  // one past the largest offset
        int64_t o = 0;
        for (int k = 0; k < nd(); k++) o += (dims[size_t(k)] - 1) * strides[size_t(k)];
        return o + 1;
    }
};

Tensor tensor_of(const Desc* d) {
    Tensor t;
    t.uid = d->one<int64_t>(CUDNN_ATTR_TENSOR_UNIQUE_ID);
    t.type = d->one<cudnnDataType_t>(CUDNN_ATTR_TENSOR_DATA_TYPE);
    t.dims = d->all<int64_t>(CUDNN_ATTR_TENSOR_DIMENSIONS);
    t.strides = d->all<int64_t>(CUDNN_ATTR_TENSOR_STRIDES);
    t.is_virtual = d->one<uint8_t>(CUDNN_ATTR_TENSOR_IS_VIRTUAL) != 0;
    t.by_value = d->one<uint8_t>(CUDNN_ATTR_TENSOR_IS_BY_VALUE) != 0;
    return t;
}

float round_to(cudnnDataType_t t, float v) {
    switch (t) {
        case CUDNN_DATA_BFLOAT16:
            return __bfloat162float(__float2bfloat16(v));
        case CUDNN_DATA_HALF:
            return __half2float(__float2half(v));
        case CUDNN_DATA_INT32:
            return float(int32_t(v));
        case CUDNN_DATA_BOOLEAN:
            return v != 0.0f ? 1.0f : 0.0f;
        default:
            return v;
    }
}

size_t type_bytes(cudnnDataType_t t) {
    switch (t) {
        case CUDNN_DATA_BFLOAT16:
        case CUDNN_DATA_HALF:
            return 2;
        case CUDNN_DATA_BOOLEAN:
            return 1;
        case CUDNN_DATA_INT64:
        case CUDNN_DATA_DOUBLE:
            return 8;
        default:
            return 4;
    }
}

float load(cudnnDataType_t t, const void* base, int64_t i) {
    const auto* p = static_cast<const uint8_t*>(base) + i * int64_t(type_bytes(t));
    switch (t) {
        case CUDNN_DATA_BFLOAT16: {
            __nv_bfloat16 v;
            std::memcpy(&v, p, 2);
            return __bfloat162float(v);
        }
        case CUDNN_DATA_HALF: {
            __half v;
            std::memcpy(&v, p, 2);
            return __half2float(v);
        }
        case CUDNN_DATA_INT32: {
            int32_t v;
            std::memcpy(&v, p, 4);
            return float(v);
        }
        case CUDNN_DATA_BOOLEAN:
            return *p ? 1.0f : 0.0f;
        default: {
            float v;
            std::memcpy(&v, p, 4);
            return v;
        }
    }
}

void store(cudnnDataType_t t, void* base, int64_t i, float v) {
    auto* p = static_cast<uint8_t*>(base) + i * int64_t(type_bytes(t));
    switch (t) {
        case CUDNN_DATA_BFLOAT16: {
            const __nv_bfloat16 b = __float2bfloat16(v);
            std::memcpy(p, &b, 2);
            break;
        }
        case CUDNN_DATA_HALF: {
            const __half h = __float2half(v);
            std::memcpy(p, &h, 2);
            break;
        }
        case CUDNN_DATA_INT32: {
            const int32_t x = int32_t(v);
            std::memcpy(p, &x, 4);
            break;
        }
        case CUDNN_DATA_BOOLEAN:
            *p = v != 0.0f;
            break;
        default:
            std::memcpy(p, &v, 4);
    }
}

// calls f(idx) for every index of `dims`, last dimension fastest
template <class F>
void for_each_index(const std::vector<int64_t>& dims, F&& f) {
    const int nd = int(dims.size());
    std::vector<int64_t> idx(size_t(nd), 0);
    for (
        int64_t n = 0, total =
                           [&] {
                               int64_t t = 1;
                               for (int64_t d : dims) t *= d;
                               return t;
                           }();
        n < total; n++) {
        f(idx.data());
        for (int k = nd - 1; k >= 0; k--) {
            if (++idx[size_t(k)] < dims[size_t(k)]) break;
            idx[size_t(k)] = 0;
        }
    }
}

// `in`'s index for the element `out_idx` of a tensor of dims `out` it is broadcast to: a dimension of 1 reads
// index 0, a divisor of the other's reads idx / (other / its); false when the dims do not fit
bool broadcastable(const std::vector<int64_t>& in, const std::vector<int64_t>& out) {
    if (in.size() != out.size()) return false;
    for (size_t k = 0; k < in.size(); k++)
        if (in[k] != out[k] && in[k] != 1 && (in[k] == 0 || out[k] % in[k] != 0)) return false;
    return true;
}
void map_index(const std::vector<int64_t>& in, const std::vector<int64_t>& out, const int64_t* out_idx,
               int64_t* in_idx) {
    for (size_t k = 0; k < in.size(); k++)
        in_idx[k] = in[k] == out[k] ? out_idx[k] : in[k] == 1 ? 0 : out_idx[k] / (out[k] / in[k]);
}

// ---- finalize: what each descriptor must have ----------------------------------------------------------

bool is_binary(cudnnPointwiseMode_t m) {
    return m == CUDNN_POINTWISE_ADD || m == CUDNN_POINTWISE_SUB || m == CUDNN_POINTWISE_MUL ||
           m == CUDNN_POINTWISE_DIV || m == CUDNN_POINTWISE_MAX || m == CUDNN_POINTWISE_CMP_GE;
}
bool is_unary(cudnnPointwiseMode_t m) {
    return m == CUDNN_POINTWISE_EXP || m == CUDNN_POINTWISE_LOG || m == CUDNN_POINTWISE_IDENTITY ||
           m == CUDNN_POINTWISE_GEN_INDEX;
}

cudnnStatus_t need(const Desc* d, std::initializer_list<int> names, const char* what) {
    for (int n : names)
        if (!d->has(n))
            return fail(CUDNN_STATUS_BAD_PARAM,
                        std::string(what) + ": attribute " + std::to_string(n) + " not set");
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalized_desc(const Desc* d, int name, const char* what) {
    const Desc* x = d->desc(name);
    if (!x || !g_live.count(const_cast<Desc*>(x)))
        return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER,
                    std::string(what) + ": descriptor " + std::to_string(name) + " missing");
    if (!x->finalized)
        return fail(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED,
                    std::string(what) + ": descriptor " + std::to_string(name) + " not finalized");
    return CUDNN_STATUS_SUCCESS;
}

#define EMU_TRY(x)                                   \
    do {                                             \
        const cudnnStatus_t st_ = (x);               \
        if (st_ != CUDNN_STATUS_SUCCESS) return st_; \
    } while (0)

// the tensors an operation reads and writes
void operands(const Desc* op, std::vector<const Desc*>& in, std::vector<const Desc*>& out) {
    switch (op->type) {
        case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR:
            in = {op->desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC), op->desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC)};
            out = {op->desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC)};
            break;
        case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR:
            in = {op->desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC)};
            if (op->has(CUDNN_ATTR_OPERATION_POINTWISE_BDESC))
                in.push_back(op->desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC));
            if (op->has(CUDNN_ATTR_OPERATION_POINTWISE_TDESC))
                in.push_back(op->desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC));
            out = {op->desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC)};
            break;
        case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR:
            in = {op->desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC)};
            out = {op->desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC)};
            break;
        case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR:
            in = {op->desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC)};
            out = {op->desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC)};
            break;
        default:
            in.clear(), out.clear();
    }
}

// The graph's operations in an order where each runs after the producers of what it reads; an error when a
// virtual tensor has no producer, two operations write one tensor, or the graph has a cycle.
cudnnStatus_t order(const Desc* graph, std::vector<const Desc*>& sorted) {
    const auto ops = graph->all<void*>(CUDNN_ATTR_OPERATIONGRAPH_OPS);
    std::map<int64_t, size_t> producer;
    for (size_t i = 0; i < ops.size(); i++) {
        std::vector<const Desc*> in, out;
        operands(static_cast<const Desc*>(ops[i]), in, out);
        for (const Desc* t : out)
            if (!producer.emplace(tensor_of(t).uid, i).second)
                return fail(CUDNN_STATUS_BAD_PARAM,
                            "operation graph: tensor " + std::to_string(tensor_of(t).uid) + " written twice");
    }
    std::vector<int> pending(ops.size(), 0);
    std::vector<std::vector<size_t>> users(ops.size());
    for (size_t i = 0; i < ops.size(); i++) {
        std::vector<const Desc*> in, out;
        operands(static_cast<const Desc*>(ops[i]), in, out);
        for (const Desc* t : in) {
            const Tensor x = tensor_of(t);
            auto it = producer.find(x.uid);
            if (it == producer.end()) {
                if (x.is_virtual)
                    return fail(CUDNN_STATUS_BAD_PARAM, "operation graph: virtual tensor " +
                                                            std::to_string(x.uid) +
                                                            " is read but never written");
                continue;
            }
            pending[i]++;
            users[it->second].push_back(i);
        }
    }
    std::vector<size_t> ready;
    for (size_t i = 0; i < ops.size(); i++)
        if (pending[i] == 0) ready.push_back(i);
    sorted.clear();
    while (!ready.empty()) {
        const size_t i = ready.back();
        ready.pop_back();
        sorted.push_back(static_cast<const Desc*>(ops[i]));
        for (size_t u : users[i])
            if (--pending[u] == 0) ready.push_back(u);
    }
    if (sorted.size() != ops.size()) return fail(CUDNN_STATUS_BAD_PARAM, "operation graph: a cycle");
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_op(Desc* d) {
    switch (d->type) {
        case CUDNN_BACKEND_TENSOR_DESCRIPTOR: {
            EMU_TRY(need(d,
                         {CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_ATTR_TENSOR_DIMENSIONS,
                          CUDNN_ATTR_TENSOR_STRIDES, CUDNN_ATTR_TENSOR_UNIQUE_ID},
                         "tensor"));
            const Tensor t = tensor_of(d);
            if (t.dims.size() != t.strides.size() || t.dims.empty())
                return fail(CUDNN_STATUS_BAD_PARAM, "tensor: dims and strides differ in count");
            for (int64_t x : t.dims)
                if (x <= 0) return fail(CUDNN_STATUS_BAD_PARAM, "tensor: a dimension is not positive");
            if (t.by_value && t.is_virtual)
                return fail(CUDNN_STATUS_BAD_PARAM, "tensor: virtual and by value");
            return CUDNN_STATUS_SUCCESS;
        }
        case CUDNN_BACKEND_POINTWISE_DESCRIPTOR: {
            EMU_TRY(need(d, {CUDNN_ATTR_POINTWISE_MODE, CUDNN_ATTR_POINTWISE_MATH_PREC}, "pointwise"));
            const auto m = d->one<cudnnPointwiseMode_t>(CUDNN_ATTR_POINTWISE_MODE);
            if (!is_binary(m) && !is_unary(m) && m != CUDNN_POINTWISE_BINARY_SELECT)
                return fail(CUDNN_STATUS_NOT_SUPPORTED,
                            "pointwise: cuemu has no mode " + std::to_string(int(m)));
            if (m == CUDNN_POINTWISE_GEN_INDEX && !d->has(CUDNN_ATTR_POINTWISE_AXIS))
                return fail(CUDNN_STATUS_BAD_PARAM, "pointwise GEN_INDEX: no axis");
            return CUDNN_STATUS_SUCCESS;
        }
        case CUDNN_BACKEND_MATMUL_DESCRIPTOR:
            return need(d, {CUDNN_ATTR_MATMUL_COMP_TYPE}, "matmul descriptor");
        case CUDNN_BACKEND_REDUCTION_DESCRIPTOR:
            return need(d, {CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_ATTR_REDUCTION_COMP_TYPE},
                        "reduction descriptor");
        case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: {
            EMU_TRY(finalized_desc(d, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, "pointwise operation"));
            EMU_TRY(finalized_desc(d, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, "pointwise operation"));
            EMU_TRY(finalized_desc(d, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, "pointwise operation"));
            const auto m = d->desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR)
                               ->one<cudnnPointwiseMode_t>(CUDNN_ATTR_POINTWISE_MODE);
            if (is_binary(m) || m == CUDNN_POINTWISE_BINARY_SELECT)
                EMU_TRY(
                    finalized_desc(d, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, "pointwise operation (binary)"));
            if (m == CUDNN_POINTWISE_BINARY_SELECT)
                EMU_TRY(
                    finalized_desc(d, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, "pointwise operation (select)"));
            std::vector<const Desc*> in, out;
            operands(d, in, out);
            const Tensor y = tensor_of(out[0]);
            if (m == CUDNN_POINTWISE_GEN_INDEX) {
                const int64_t axis = d->desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR)
                                         ->one<int64_t>(CUDNN_ATTR_POINTWISE_AXIS);
                if (axis < 0 || axis >= y.nd())
                    return fail(CUDNN_STATUS_BAD_PARAM, "GEN_INDEX: axis out of range");
            }
            for (const Desc* x : in)
                if (!broadcastable(tensor_of(x).dims, y.dims))
                    return fail(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH,
                                "pointwise operation: an input does not broadcast to the output");
            return CUDNN_STATUS_SUCCESS;
        }
        case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: {
            for (int n : {CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_ATTR_OPERATION_MATMUL_BDESC,
                          CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_ATTR_OPERATION_MATMUL_DESC})
                EMU_TRY(finalized_desc(d, n, "matmul operation"));
            const Tensor a = tensor_of(d->desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC)),
                         b = tensor_of(d->desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC)),
                         c = tensor_of(d->desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC));
            const int nd = c.nd();
            if (a.nd() != nd || b.nd() != nd || nd < 2)
                return fail(CUDNN_STATUS_BAD_PARAM, "matmul operation: operands of different ranks");
            const auto& ad = a.dims;
            const auto& bd = b.dims;
            const auto& cd = c.dims;
            if (ad[size_t(nd - 1)] != bd[size_t(nd - 2)] || ad[size_t(nd - 2)] != cd[size_t(nd - 2)] ||
                bd[size_t(nd - 1)] != cd[size_t(nd - 1)])
                return fail(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH,
                            "matmul operation: A (m, k) B (k, n) C (m, n) do not fit");
            for (int k = 0; k < nd - 2; k++)
                if (!broadcastable({ad[size_t(k)]}, {cd[size_t(k)]}) ||
                    !broadcastable({bd[size_t(k)]}, {cd[size_t(k)]}))
                    return fail(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH,
                                "matmul operation: batch dimensions do not fit");
            return CUDNN_STATUS_SUCCESS;
        }
        case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: {
            for (int n : {CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_ATTR_OPERATION_REDUCTION_YDESC,
                          CUDNN_ATTR_OPERATION_REDUCTION_DESC})
                EMU_TRY(finalized_desc(d, n, "reduction operation"));
            if (!broadcastable(tensor_of(d->desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC)).dims,
                               tensor_of(d->desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC)).dims))
                return fail(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH,
                            "reduction operation: Y is not a reduction of X");
            return CUDNN_STATUS_SUCCESS;
        }
        case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: {
            EMU_TRY(finalized_desc(d, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, "reshape operation"));
            EMU_TRY(finalized_desc(d, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, "reshape operation"));
            if (tensor_of(d->desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC)).count() !=
                tensor_of(d->desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC)).count())
                return fail(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH,
                            "reshape operation: element counts differ");
            return CUDNN_STATUS_SUCCESS;
        }
        case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: {
            EMU_TRY(need(d, {CUDNN_ATTR_OPERATIONGRAPH_OPS}, "operation graph"));
            for (void* op : d->all<void*>(CUDNN_ATTR_OPERATIONGRAPH_OPS))
                if (!g_live.count(static_cast<Desc*>(op)) || !static_cast<Desc*>(op)->finalized)
                    return fail(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED,
                                "operation graph: an operation is not finalized");
            std::vector<const Desc*> sorted;
            return order(d, sorted);
        }
        case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: {
            EMU_TRY(need(d, {CUDNN_ATTR_ENGINEHEUR_MODE}, "engine heuristic"));
            EMU_TRY(finalized_desc(d, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, "engine heuristic"));
            // the engines it offers: a nondeterministic one first when asked, then the deterministic one
            // (none with "only")
            const char* nd_env = std::getenv("CUEMU_CUDNN_NONDETERMINISTIC");
            const bool nd_only = nd_env && std::string_view(nd_env) == "only";
            const bool nd_first = nd_only || env_on("CUEMU_CUDNN_NONDETERMINISTIC");
            const int n = env_on("CUEMU_CUDNN_NO_ENGINE") ? 0 : nd_first && !nd_only ? 2 : 1;
            for (int i = 0; i < n; i++) {
                auto* e = new Desc{CUDNN_BACKEND_ENGINE_DESCRIPTOR, {}, true, {}};
                void* graph = d->desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH);
                e->put(CUDNN_ATTR_ENGINE_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
                const int64_t index = i;
                e->put(CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &index);
                const cudnnBackendNumericalNote_t nd = CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
                e->put(CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                       nd_first && i == 0 ? 1 : 0, &nd);
                g_live.insert(e);
                d->owned.push_back(e);
            }
            return CUDNN_STATUS_SUCCESS;
        }
        case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: {
            EMU_TRY(need(d, {400 /* CUDNN_ATTR_EXECUTION_PLAN_HANDLE */}, "execution plan"));
            EMU_TRY(finalized_desc(d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, "execution plan"));
            const int64_t ws = int64_t(1) << 20;
            d->put(CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &ws);
            return CUDNN_STATUS_SUCCESS;
        }
        case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: {
            EMU_TRY(need(d, {CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS},
                         "variant pack"));
            if (d->attrs[CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS].count !=
                d->attrs[CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS].count)
                return fail(CUDNN_STATUS_BAD_PARAM, "variant pack: ids and pointers differ in count");
            return CUDNN_STATUS_SUCCESS;
        }
        default:
            return fail(CUDNN_STATUS_NOT_SUPPORTED,
                        "cuemu: descriptor type " + std::to_string(int(d->type)) + " not emulated");
    }
}

// ---- execution -----------------------------------------------------------------------------------------

// Every tensor's values while a plan runs: non-virtual and by-value tensors in the pack's memory, virtual
// ones in a float image indexed by their own strides.
struct Store {
    std::map<int64_t, void*> pack;
    std::map<int64_t, std::vector<float>> images;
};

// One operand of an operation: its tensor and where its values are, looked up once.
struct View {
    Tensor t;
    void* mem = nullptr;                // non-virtual or by value: the pack's memory
    std::vector<float>* img = nullptr;  // virtual: the image
    View(Store& s, const Desc* d) : t(tensor_of(d)) {
        if (!t.is_virtual) {
            mem = s.pack.at(t.uid);
        } else {
            img = &s.images[t.uid];
            if (img->empty()) img->assign(size_t(t.span()), std::numeric_limits<float>::quiet_NaN());
        }
    }
    float get(const int64_t* idx) const {
        if (t.by_value) return load(t.type, mem, 0);
        return mem ? load(t.type, mem, t.offset(idx)) : (*img)[size_t(t.offset(idx))];
    }
    void set(const int64_t* idx, float v) const {
        v = round_to(t.type, v);
        if (mem)
            store(t.type, mem, t.offset(idx), v);
        else
            (*img)[size_t(t.offset(idx))] = v;
    }
};

float apply(cudnnPointwiseMode_t m, float x, float b, float t) {
    switch (m) {
        case CUDNN_POINTWISE_ADD:
            return x + b;
        case CUDNN_POINTWISE_SUB:
            return x - b;
        case CUDNN_POINTWISE_MUL:
            return x * b;
        case CUDNN_POINTWISE_DIV:
            return x / b;
        case CUDNN_POINTWISE_MAX:
            return std::max(x, b);
        case CUDNN_POINTWISE_EXP:
            return std::exp(x);
        case CUDNN_POINTWISE_LOG:
            return std::log(x);
        case CUDNN_POINTWISE_IDENTITY:
            return x;
        case CUDNN_POINTWISE_CMP_GE:
            return x >= b ? 1.0f : 0.0f;
        case CUDNN_POINTWISE_BINARY_SELECT:
            return t != 0.0f ? x : b;
        default:
            return std::numeric_limits<float>::quiet_NaN();
    }
}

void run(const Desc* op, Store& s) {
    std::vector<const Desc*> in, out;
    operands(op, in, out);
    const View y(s, out[0]);
    const auto& yd = y.t.dims;
    std::vector<int64_t> a_idx(8), b_idx(8);
    switch (op->type) {
        case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: {
            const View a(s, in[0]), b(s, in[1]);
            const int nd = y.t.nd();
            const int64_t K = a.t.dims[size_t(nd - 1)];
            // batch dimensions broadcast; the product's own two dimensions taken from idx
            const std::vector<int64_t> yb(yd.begin(), yd.end() - 2), ab(a.t.dims.begin(), a.t.dims.end() - 2),
                bb(b.t.dims.begin(), b.t.dims.end() - 2);
            for_each_index(yd, [&](const int64_t* idx) {
                map_index(ab, yb, idx, a_idx.data());
                map_index(bb, yb, idx, b_idx.data());
                a_idx[size_t(nd - 2)] = idx[nd - 2], b_idx[size_t(nd - 1)] = idx[nd - 1];
                float acc = 0.0f;
                for (int64_t k = 0; k < K; k++) {
                    a_idx[size_t(nd - 1)] = k, b_idx[size_t(nd - 2)] = k;
                    acc += a.get(a_idx.data()) * b.get(b_idx.data());
                }
                y.set(idx, acc);
            });
            break;
        }
        case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: {
            const Desc* pw = op->desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR);
            const auto m = pw->one<cudnnPointwiseMode_t>(CUDNN_ATTR_POINTWISE_MODE);
            const int64_t axis = pw->one<int64_t>(CUDNN_ATTR_POINTWISE_AXIS, -1);
            std::vector<View> xs;
            for (const Desc* d : in) xs.emplace_back(s, d);
            for_each_index(yd, [&](const int64_t* idx) {
                float v[3] = {0.0f, 0.0f, 0.0f};
                for (size_t i = 0; i < xs.size(); i++) {
                    map_index(xs[i].t.dims, yd, idx, a_idx.data());
                    v[i] = xs[i].get(a_idx.data());
                }
                y.set(idx, m == CUDNN_POINTWISE_GEN_INDEX ? float(idx[axis]) : apply(m, v[0], v[1], v[2]));
            });
            break;
        }
        case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: {
            const View x(s, in[0]);
            const auto& xd = x.t.dims;
            const auto r = op->desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC)
                               ->one<cudnnReduceTensorOp_t>(CUDNN_ATTR_REDUCTION_OPERATOR);
            const bool max = r == CUDNN_REDUCE_TENSOR_MAX;
            // y's elements in y's own order, each the reduction of the x elements that map to it (a dimension
            // of 1 or a group of x's), in x's order
            std::vector<float> acc(size_t(y.t.count()));
            std::vector<char> fresh(acc.size(), 1);
            for_each_index(xd, [&](const int64_t* idx) {
                int64_t at = 0;
                for (size_t k = 0; k < xd.size(); k++)
                    at = at * yd[k] + (yd[k] == xd[k] ? idx[k] : yd[k] == 1 ? 0 : idx[k] / (xd[k] / yd[k]));
                const float v = x.get(idx);
                float& a = acc[size_t(at)];
                a = fresh[size_t(at)] ? v : max ? std::max(a, v) : a + v;
                fresh[size_t(at)] = 0;
            });
            int64_t n = 0;
            for_each_index(yd, [&](const int64_t* idx) { y.set(idx, acc[size_t(n++)]); });
            break;
        }
        case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: {
            // y is x's memory: x's values laid out by x's strides, read back through y's
            const View x(s, in[0]);
            std::vector<float> image(size_t(std::max(x.t.span(), y.t.span())),
                                     std::numeric_limits<float>::quiet_NaN());
            for_each_index(x.t.dims,
                           [&](const int64_t* idx) { image[size_t(x.t.offset(idx))] = x.get(idx); });
            for_each_index(yd, [&](const int64_t* idx) { y.set(idx, image[size_t(y.t.offset(idx))]); });
            break;
        }
        default:
            break;
    }
}

}  // namespace

extern "C" {

size_t cudnnGetVersion(void) {
    return 91900;
}

const char* cudnnGetErrorString(cudnnStatus_t status) {
    switch (status) {
        case CUDNN_STATUS_SUCCESS:
            return "CUDNN_STATUS_SUCCESS";
        case CUDNN_STATUS_NOT_SUPPORTED:
            return "CUDNN_STATUS_NOT_SUPPORTED";
        case CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH:
            return "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH";
        case CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED:
            return "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED";
        default:
            return "CUDNN_STATUS_BAD_PARAM";
    }
}

void cudnnGetLastErrorString(char* message, size_t max_size) {
    if (!message || max_size == 0) return;
    std::snprintf(message, max_size, "%s", g_last_error.c_str());
    g_last_error.clear();
}

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
    static int dummy;
    *handle = reinterpret_cast<cudnnHandle_t>(&dummy);
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroy(cudnnHandle_t) {
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetStream(cudnnHandle_t, cudaStream_t) {
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t type, cudnnBackendDescriptor_t* d) {
    auto* p = new Desc{type, {}, false, {}};
    g_live.insert(p);
    *d = p;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t d) {
    Desc* p = live(d);
    if (!p) return fail(CUDNN_STATUS_BAD_PARAM, "destroying an unknown descriptor");
    for (Desc* o : p->owned) g_live.erase(o);
    g_live.erase(p);
    delete p;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t n, const void* v) {
    Desc* p = live(d);
    if (!p) return fail(CUDNN_STATUS_BAD_PARAM, "setting an attribute of an unknown descriptor");
    if (p->finalized) return fail(CUDNN_STATUS_BAD_PARAM, "setting an attribute of a finalized descriptor");
    if (n < 0 || (n > 0 && !v)) return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "attribute without values");
    p->put(int(name), type, n, v);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const d, cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t, int64_t requested, int64_t* count,
                                       void* out) {
    Desc* p = live(d);
    if (!p || !p->finalized)
        return fail(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, "reading an unfinalized descriptor");
    if (p->type == CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR && name == CUDNN_ATTR_ENGINEHEUR_RESULTS) {
        *count = int64_t(p->owned.size());
        if (requested == 0) return CUDNN_STATUS_SUCCESS;
        *count = std::min<int64_t>(requested, int64_t(p->owned.size()));
        auto** cfgs = static_cast<cudnnBackendDescriptor_t*>(out);
        for (int64_t i = 0; i < *count; i++) {
            Desc* cfg = live(cfgs[i]);
            if (!cfg) return fail(CUDNN_STATUS_BAD_PARAM, "heuristic results into an unknown descriptor");
            void* engine = p->owned[size_t(i)];
            cfg->put(CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &engine);
            cfg->finalized = true;
        }
        return CUDNN_STATUS_SUCCESS;
    }
    if (p->type == CUDNN_BACKEND_ENGINECFG_DESCRIPTOR && name == CUDNN_ATTR_ENGINECFG_ENGINE) {
        // the caller's engine descriptor becomes a copy of the configuration's
        Desc* into = live(*static_cast<cudnnBackendDescriptor_t*>(out));
        if (!into) return fail(CUDNN_STATUS_BAD_PARAM, "engine into an unknown descriptor");
        into->attrs = p->desc(CUDNN_ATTR_ENGINECFG_ENGINE)->attrs;
        into->finalized = true;
        *count = 1;
        return CUDNN_STATUS_SUCCESS;
    }
    auto it = p->attrs.find(int(name));
    if (it == p->attrs.end()) {
        if (name == CUDNN_ATTR_ENGINE_NUMERICAL_NOTE || name == CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE) {
            *count = 0;
            return CUDNN_STATUS_SUCCESS;
        }
        return fail(CUDNN_STATUS_NOT_SUPPORTED,
                    "cuemu: attribute " + std::to_string(int(name)) + " not readable");
    }
    *count = std::min(requested, it->second.count);
    if (out) std::memcpy(out, it->second.bytes.data(), size_t(*count) * elem_size(it->second.type));
    if (requested == 0) *count = it->second.count;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t d) {
    Desc* p = live(d);
    if (!p) return fail(CUDNN_STATUS_BAD_PARAM, "finalizing an unknown descriptor");
    if (p->finalized) return fail(CUDNN_STATUS_BAD_PARAM, "finalizing a descriptor twice");
    EMU_TRY(finalize_op(p));
    p->finalized = true;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t plan,
                                  cudnnBackendDescriptor_t pack) {
    // (a captured execution is not emulated: the capture is given up, and the caller runs without a graph)
    if (cuemu::capture_refuses("cudnnBackendExecute"))
        return fail(CUDNN_STATUS_NOT_SUPPORTED, "executing inside a stream capture is not emulated");
    const Desc* pl = live(plan);
    const Desc* vp = live(pack);
    if (!handle || !pl || !vp || !pl->finalized || !vp->finalized)
        return fail(CUDNN_STATUS_BAD_PARAM,
                    "executing: a handle, a finalized plan and a finalized variant pack are needed");
    const Desc* engine = pl->desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG)->desc(CUDNN_ATTR_ENGINECFG_ENGINE);
    const Desc* graph = engine->desc(CUDNN_ATTR_ENGINE_OPERATION_GRAPH);
    std::vector<const Desc*> ops;
    EMU_TRY(order(graph, ops));
    Store s;
    const auto uids = vp->all<int64_t>(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS);
    const auto ptrs = vp->all<void*>(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
    for (size_t i = 0; i < uids.size(); i++) s.pack[uids[i]] = ptrs[i];
    if (pl->one<int64_t>(CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE) > 0 &&
        !vp->one<void*>(CUDNN_ATTR_VARIANT_PACK_WORKSPACE))
        return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER,
                    "executing: the plan needs a workspace and the pack has none");
    // every non-virtual tensor the graph touches must be in the pack
    for (const Desc* op : ops) {
        std::vector<const Desc*> in, out;
        operands(op, in, out);
        for (const auto* list : {&in, &out})
            for (const Desc* t : *list) {
                const Tensor x = tensor_of(t);
                if (!x.is_virtual && !s.pack.count(x.uid))
                    return fail(CUDNN_STATUS_BAD_PARAM,
                                "executing: tensor " + std::to_string(x.uid) + " is not in the variant pack");
            }
    }
    for (const Desc* op : ops) run(op, s);
    return CUDNN_STATUS_SUCCESS;
}

}  // extern "C"
