// anvil.Tensor and its exchange protocols (tensor.h). DLPack's unversioned types come from Debian's
// libdlpack-dev (0.6); DLPack 1.0 adds a versioned managed tensor around the same DLTensor, declared here as
// the specification lays it out.
#include "python/tensor.h"

#include <dlpack/dlpack.h>
#include <pybind11/stl.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"

namespace anvil::python {

namespace {

// DLPack 1.0 (dlpack.h 1.0: DLPackVersion, DLManagedTensorVersioned)
struct DLPackVersion {
    uint32_t major, minor;
};
struct DLManagedTensorVersioned {
    DLPackVersion version;
    void* manager_ctx;
    void (*deleter)(DLManagedTensorVersioned* self);
    uint64_t flags;
    DLTensor dl_tensor;
};
constexpr const char* kCapsule = "dltensor";
constexpr const char* kCapsuleUsed = "used_dltensor";
constexpr const char* kCapsuleV1 = "dltensor_versioned";
constexpr const char* kCapsuleV1Used = "used_dltensor_versioned";

// How the exchange protocols name each dtype anvil hands out: DLPack's type code and bits, numpy's
// array-interface typestr (none for bfloat16), and the name torch and numpy give it.
struct DTypeNames {
    DType dtype;
    uint8_t code, bits;
    const char* typestr;
    const char* name;
};
constexpr DTypeNames kDTypes[] = {{DType::F32, kDLFloat, 32, "<f4", "float32"},
                                  {DType::F16, kDLFloat, 16, "<f2", "float16"},
                                  {DType::BF16, kDLBfloat, 16, nullptr, "bfloat16"},
                                  {DType::I32, kDLInt, 32, "<i4", "int32"},
                                  {DType::I8, kDLInt, 8, "|i1", "int8"},
                                  {DType::U8, kDLUInt, 8, "|u1", "uint8"},
                                  {DType::U16, kDLUInt, 16, "<u2", "uint16"}};

const DTypeNames* names_of(DType d) {
    for (const DTypeNames& n : kDTypes)
        if (n.dtype == d) return &n;
    return nullptr;
}

DLDataType dl_dtype(DType d) {
    const DTypeNames* n = names_of(d);
    if (!n) fail("anvil.Tensor: a {} tensor has no DLPack dtype", dtype_name(d));
    return {n->code, n->bits, 1};
}

DType from_dl_dtype(DLDataType t) {
    ANVIL_CHECK(t.lanes == 1, "from_dlpack: vector dtypes ({} lanes) are not supported", int(t.lanes));
    for (const DTypeNames& n : kDTypes)
        if (n.code == t.code && n.bits == t.bits) return n.dtype;
    fail(
        "from_dlpack: dtype code {} with {} bits is not one anvil holds (float32, float16, bfloat16, int32, "
        "int8, uint8, uint16); convert it first (torch: .float())",
        int(t.code), int(t.bits));
}

std::string py_dtype_name(DType d) {
    const DTypeNames* n = names_of(d);
    return n ? n->name : std::string(dtype_name(d));
}

// Elements from one index to the next along each dimension: row-major, the rows of a strided view
// (Tensor::cols) ld() apart.
std::vector<int64_t> elem_strides(const Tensor& t) {
    const int nd = t.shape.ndim;
    std::vector<int64_t> st(size_t(nd), 1);
    for (int i = nd - 2; i >= 0; i--)
        st[size_t(i)] = i == nd - 2 ? t.ld() : st[size_t(i + 1)] * t.shape[i + 1];
    return st;
}

// What an exported tensor keeps alive until its consumer calls the deleter, and the arrays DLTensor points
// at. A strided view (Tensor::cols) exports its row stride.
struct ExportCtx {
    std::shared_ptr<void> owner;
    std::shared_ptr<Backend> be;
    std::vector<int64_t> shape, strides;
};

template <class Managed>
Managed* make_managed(const PyTensor& p) {
    auto* ctx = new ExportCtx{p.owner, p.be, p.t.shape.vec(), elem_strides(p.t)};
    auto* m = new Managed{};
    m->manager_ctx = ctx;
    m->deleter = [](Managed* self) {
        delete static_cast<ExportCtx*>(self->manager_ctx);
        delete self;
    };
    DLTensor& d = m->dl_tensor;
    d.data = p.t.data;
    d.device = {p.t.device == Device::CUDA ? kDLCUDA : kDLCPU, p.t.device == Device::CUDA ? p.device_id : 0};
    d.ndim = p.t.shape.ndim;
    d.dtype = dl_dtype(p.t.dtype);
    d.shape = ctx->shape.data();
    d.strides = ctx->strides.data();
    d.byte_offset = 0;
    return m;
}

// A capsule never consumed frees its tensor; a consumed one was renamed and is the consumer's to free.
template <class Managed>
void free_unconsumed(PyObject* cap, const char* name) {
    if (!PyCapsule_IsValid(cap, name)) return;
    auto* m = static_cast<Managed*>(PyCapsule_GetPointer(cap, name));
    if (m && m->deleter) m->deleter(m);
}

py::object to_dlpack(const PyTensor& p, const py::object& stream, const py::object& max_version,
                     const py::object& dl_device, const py::object& copy) {
    if (!copy.is_none() && copy.cast<bool>())
        throw py::buffer_error("anvil.Tensor.__dlpack__: copy=True is not supported; anvil shares memory");
    if (!dl_device.is_none()) {
        const auto want = dl_device.cast<std::pair<int, int>>();
        const int type = p.t.device == Device::CUDA ? kDLCUDA : kDLCPU;
        if (want.first != type || (type == kDLCUDA && want.second != p.device_id))
            throw py::buffer_error("anvil.Tensor.__dlpack__: the tensor is on another device than dl_device");
    }
    (void)stream;  // the device's queued work is waited for instead: any consumer stream then sees it done
    p.sync();
    const bool v1 = !max_version.is_none() && max_version.cast<std::pair<int, int>>().first >= 1;
    if (v1) {
        DLManagedTensorVersioned* m = make_managed<DLManagedTensorVersioned>(p);
        m->version = {1, 0};
        m->flags = 0;
        PyObject* cap = PyCapsule_New(
            m, kCapsuleV1, [](PyObject* c) { free_unconsumed<DLManagedTensorVersioned>(c, kCapsuleV1); });
        if (!cap) {
            m->deleter(m);
            throw py::error_already_set();
        }
        return py::reinterpret_steal<py::object>(cap);
    }
    DLManagedTensor* m = make_managed<DLManagedTensor>(p);
    PyObject* cap =
        PyCapsule_New(m, kCapsule, [](PyObject* c) { free_unconsumed<DLManagedTensor>(c, kCapsule); });
    if (!cap) {
        m->deleter(m);
        throw py::error_already_set();
    }
    return py::reinterpret_steal<py::object>(cap);
}

// The imported DLTensor as an anvil view; the caller keeps the capsule's tensor alive.
PyTensor wrap_imported(const DLTensor& d) {
    ANVIL_CHECK(d.device.device_type == kDLCPU || d.device.device_type == kDLCUDA,
                "from_dlpack: the tensor is on DLPack device type {}; anvil takes CPU and CUDA tensors",
                int(d.device.device_type));
    ANVIL_CHECK(d.ndim >= 0 && d.ndim <= kMaxDims, "from_dlpack: {} dimensions; anvil takes up to {}", d.ndim,
                kMaxDims);
    PyTensor p;
    p.t.dtype = from_dl_dtype(d.dtype);
    p.t.device = d.device.device_type == kDLCUDA ? Device::CUDA : Device::CPU;
    p.device_id = d.device.device_id;
    p.t.shape.ndim = d.ndim;
    for (int i = 0; i < d.ndim; i++) p.t.shape.dims[size_t(i)] = d.shape[i];
    if (d.strides) {
        int64_t want = 1;
        for (int i = d.ndim - 1; i >= 0; i--) {
            ANVIL_CHECK(d.shape[i] == 1 || d.strides[i] == want,
                        "from_dlpack: the tensor is not contiguous (shape {}); pass .contiguous() first",
                        p.t.shape.str());
            want *= d.shape[i];
        }
    }
    p.t.data = static_cast<char*>(d.data) + d.byte_offset;
    return p;
}

py::dict array_interface(const PyTensor& p, bool cuda) {
    const DTypeNames* n = names_of(p.t.dtype);
    if (!n || !n->typestr)
        throw py::attribute_error("anvil.Tensor: " + py_dtype_name(p.t.dtype) +
                                  " has no array-interface type; use torch.from_dlpack");
    const char* typestr = n->typestr;
    p.sync();
    py::list shape, strides;
    for (int i = 0; i < p.t.shape.ndim; i++) shape.append(p.t.shape[i]);
    for (int64_t x : elem_strides(p.t)) strides.append(x * int64_t(dtype_size(p.t.dtype)));
    py::dict d;
    d["shape"] = py::tuple(shape);
    d["typestr"] = typestr;
    d["data"] = py::make_tuple(reinterpret_cast<uintptr_t>(p.t.data), false);
    d["strides"] = p.t.contiguous() ? py::object(py::none()) : py::object(py::tuple(strides));
    d["version"] = 3;
    if (cuda) d["stream"] = py::none();  // synchronized above: nothing for the consumer to wait for
    return d;
}

}  // namespace

PyTensor new_tensor(const std::shared_ptr<Backend>& be, Shape shape, int device_id) {
    auto buf = std::make_shared<Buffer>(be->alloc(size_t(shape.numel()) * sizeof(float)));
    PyTensor p;
    p.t = Tensor{buf->data(), shape, DType::F32, be->device()};
    // the buffer's free needs the backend: the owner holds both, the buffer going first
    struct Owned {
        std::shared_ptr<Backend> be;
        std::shared_ptr<Buffer> buf;
    };
    p.owner = std::make_shared<Owned>(Owned{be, buf});
    p.be = be;
    p.device_id = device_id;
    return p;
}

PyTensor tensor_from_dlpack(const py::object& obj) {
    if (py::isinstance<PyTensor>(obj)) return obj.cast<PyTensor>();
    ANVIL_CHECK(py::hasattr(obj, "__dlpack__"),
                "from_dlpack: a {} has no __dlpack__; pass a torch tensor, a numpy array or an anvil.Tensor",
                std::string(py::str(py::type::of(obj).attr("__name__"))));
    py::object cap = obj.attr("__dlpack__")();
    PyObject* c = cap.ptr();
    ANVIL_CHECK(PyCapsule_IsValid(c, kCapsule),
                "from_dlpack: __dlpack__ returned something other than an "
                "unconsumed \"dltensor\" capsule");
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(c, kCapsule));
    PyCapsule_SetName(c, kCapsuleUsed);
    std::shared_ptr<DLManagedTensor> keep(m, [](DLManagedTensor* x) {
        if (x->deleter) x->deleter(x);
    });
    PyTensor p = wrap_imported(m->dl_tensor);
    p.owner = keep;
    return p;
}

void bind_tensor(py::module_& m) {
    py::class_<PyTensor>(m, "Tensor", R"(A tensor in anvil's memory (CPU or CUDA), shared without copies.

torch.from_dlpack(t) and numpy.asarray(t) (CPU) see the same memory; the storage stays alive while any of
them holds it, after the model that made it is gone. anvil.Tensor.from_dlpack(x) wraps a torch tensor or
numpy array the same way.)")
        .def_property_readonly("shape",
                               [](const PyTensor& p) { return py::tuple(py::cast(p.t.shape.vec())); })
        .def_property_readonly(
            "dtype", [](const PyTensor& p) { return py_dtype_name(p.t.dtype); },
            "the element type as torch and numpy name it: float32, bfloat16, float16, int32, "
            "int8, uint8, uint16")
        .def_property_readonly("device",
                               [](const PyTensor& p) {
                                   return p.t.device == Device::CUDA ? "cuda:" + std::to_string(p.device_id)
                                                                     : std::string("cpu");
                               })
        .def(
            "data_ptr", [](const PyTensor& p) { return reinterpret_cast<uintptr_t>(p.t.data); },
            "the address of the first element (as torch.Tensor.data_ptr)")
        .def("numel", [](const PyTensor& p) { return p.t.numel(); })
        .def("__len__", [](const PyTensor& p) { return p.t.shape.ndim ? p.t.shape[0] : 0; })
        .def("__repr__",
             [](const PyTensor& p) {
                 return "anvil.Tensor(shape=" + p.t.shape.str() + ", dtype=" + py_dtype_name(p.t.dtype) +
                        ", device=" + (p.t.device == Device::CUDA ? "cuda" : "cpu") + ")";
             })
        .def("__dlpack__", &to_dlpack, py::kw_only(), py::arg("stream") = py::none(),
             py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(),
             py::arg("copy") = py::none(),
             "a DLPack capsule over this tensor's memory (DLPack 1.0's when max_version >= (1, 0))")
        .def("__dlpack_device__",
             [](const PyTensor& p) {
                 return py::make_tuple(int(p.t.device == Device::CUDA ? kDLCUDA : kDLCPU),
                                       p.t.device == Device::CUDA ? p.device_id : 0);
             })
        .def_property_readonly("__array_interface__",
                               [](const PyTensor& p) {
                                   if (p.t.device != Device::CPU)
                                       throw py::attribute_error(
                                           "anvil.Tensor: a CUDA tensor has __cuda_array_interface__, not "
                                           "__array_interface__");
                                   return array_interface(p, false);
                               })
        .def_property_readonly(
            "__cuda_array_interface__",
            [](const PyTensor& p) {
                if (p.t.device != Device::CUDA)
                    throw py::attribute_error("anvil.Tensor: a CPU tensor has __array_interface__");
                return array_interface(p, true);
            })
        .def_static("from_dlpack", &tensor_from_dlpack, py::arg("obj"),
                    "wrap any object with __dlpack__ (a torch tensor, a numpy array) without copying");
}

}  // namespace anvil::python
