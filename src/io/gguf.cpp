#include "io/gguf.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "io/fs.h"

namespace anvil::gguf {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint32_t kVersion = 3;
constexpr uint64_t kAlignment = 32;  // general.alignment's default
constexpr uint32_t kMaxDims = 4;     // ggml's GGML_MAX_DIMS

size_t scalar_bytes(Type t) {
    switch (t) {
        case Type::U8:
        case Type::I8:
        case Type::Bool:
            return 1;
        case Type::U16:
        case Type::I16:
            return 2;
        case Type::U32:
        case Type::I32:
        case Type::F32:
            return 4;
        case Type::U64:
        case Type::I64:
        case Type::F64:
            return 8;
        default:
            return 0;  // String, Array: variable
    }
}

bool known_type(uint32_t t) {
    return t <= uint32_t(Type::F64);
}

uint64_t align_up(uint64_t x, uint64_t a) {
    return (x + a - 1) / a * a;
}

// ---- writing

void put(std::string& out, const void* p, size_t n) {
    out.append(static_cast<const char*>(p), n);
}
template <typename T>
void put(std::string& out, T v) {
    put(out, &v, sizeof v);
}
void put_string(std::string& out, const std::string& s) {
    put(out, uint64_t(s.size()));
    put(out, s.data(), s.size());
}

// A scalar of type t from an integer or a float.
void put_number(std::string& out, Type t, int64_t i, double f) {
    switch (t) {
        case Type::U8:
            return put(out, uint8_t(i));
        case Type::I8:
            return put(out, int8_t(i));
        case Type::Bool:
            return put(out, uint8_t(i != 0));
        case Type::U16:
            return put(out, uint16_t(i));
        case Type::I16:
            return put(out, int16_t(i));
        case Type::U32:
            return put(out, uint32_t(i));
        case Type::I32:
            return put(out, int32_t(i));
        case Type::U64:
            return put(out, uint64_t(i));
        case Type::I64:
            return put(out, int64_t(i));
        case Type::F32:
            return put(out, float(f));
        case Type::F64:
            return put(out, f);
        default:
            ANVIL_ASSERT(false);
    }
}

void put_value(std::string& out, const Value& v) {
    put(out, uint32_t(v.type));
    if (v.type == Type::String) return put_string(out, v.s);
    if (v.type != Type::Array) return put_number(out, v.type, v.i, v.f);
    put(out, uint32_t(v.elem));
    put(out, uint64_t(v.size()));
    if (v.elem == Type::String)
        for (const std::string& s : v.strs) put_string(out, s);
    else if (v.elem == Type::F32 || v.elem == Type::F64)
        for (double f : v.floats) put_number(out, v.elem, 0, f);
    else
        for (int64_t i : v.ints) put_number(out, v.elem, i, 0.0);
}

// ---- reading: a cursor that never passes the end, errors naming the field

class Cursor {
public:
    Cursor(const uint8_t* d, size_t n, const std::string& what) : d_(d), n_(n), what_(what) {}
    size_t pos() const { return pos_; }
    size_t left() const { return n_ - pos_; }
    void need(uint64_t bytes, const std::string& field) const {
        if (bytes > left())
            fail(
                "{}: not a complete GGUF file: {} needs {} bytes at offset {}, {} are left (truncated or "
                "corrupt; export it again)",
                what_, field, bytes, pos_, left());
    }
    template <typename T>
    T get(const std::string& field) {
        need(sizeof(T), field);
        T v;
        std::memcpy(&v, d_ + pos_, sizeof v);
        pos_ += sizeof v;
        return v;
    }
    std::string string(const std::string& field) {
        const uint64_t n = get<uint64_t>(field + "'s length");
        need(n, field);
        std::string s(reinterpret_cast<const char*>(d_ + pos_), size_t(n));
        pos_ += size_t(n);
        return s;
    }
    [[noreturn]] void bad(const std::string& field, const std::string& why) const {
        fail(
            "{}: {} {} (offset {}): the file is truncated or corrupt, or not a GGUF file anvil reads; export "
            "or "
            "copy it again",
            what_, field, why, pos_);
    }

private:
    const uint8_t* d_;
    size_t n_, pos_ = 0;
    const std::string& what_;
};

void get_number(Cursor& c, Type t, const std::string& field, int64_t* i, double* f) {
    switch (t) {
        case Type::U8:
            *i = c.get<uint8_t>(field);
            return;
        case Type::I8:
            *i = c.get<int8_t>(field);
            return;
        case Type::Bool:
            *i = c.get<uint8_t>(field) != 0;
            return;
        case Type::U16:
            *i = c.get<uint16_t>(field);
            return;
        case Type::I16:
            *i = c.get<int16_t>(field);
            return;
        case Type::U32:
            *i = c.get<uint32_t>(field);
            return;
        case Type::I32:
            *i = c.get<int32_t>(field);
            return;
        case Type::U64: {
            const uint64_t u = c.get<uint64_t>(field);
            if (u > uint64_t(INT64_MAX)) c.bad(field, "is larger than anvil reads");
            *i = int64_t(u);
            return;
        }
        case Type::I64:
            *i = c.get<int64_t>(field);
            return;
        case Type::F32:
            *f = c.get<float>(field);
            return;
        case Type::F64:
            *f = c.get<double>(field);
            return;
        default:
            c.bad(field, "has no number type");
    }
}

Value get_value(Cursor& c, const std::string& key) {
    Value v;
    const uint32_t t = c.get<uint32_t>(key + "'s type");
    if (!known_type(t)) c.bad(key, fmt::format("has an unknown type {}", t));
    v.type = Type(t);
    if (v.type == Type::String) {
        v.s = c.string(key);
        return v;
    }
    if (v.type != Type::Array) {
        get_number(c, v.type, key, &v.i, &v.f);
        return v;
    }
    const uint32_t e = c.get<uint32_t>(key + "'s element type");
    if (!known_type(e) || Type(e) == Type::Array)
        c.bad(key, fmt::format("has an unusable element type {}", e));
    v.elem = Type(e);
    const uint64_t n = c.get<uint64_t>(key + "'s length");
    // every element takes at least one byte (a string its 8-byte length): a count the file cannot hold is
    // refused before anything is allocated for it
    const uint64_t least = v.elem == Type::String ? 8 : scalar_bytes(v.elem);
    if (n > c.left() / least) c.bad(key, fmt::format("claims {} elements, more than the file holds", n));
    for (uint64_t k = 0; k < n; k++) {
        if (v.elem == Type::String) {
            v.strs.push_back(c.string(key));
        } else {
            int64_t i = 0;
            double f = 0.0;
            get_number(c, v.elem, key, &i, &f);
            if (v.elem == Type::F32 || v.elem == Type::F64)
                v.floats.push_back(f);
            else
                v.ints.push_back(i);
        }
    }
    return v;
}

}  // namespace

const char* type_name(Type t) {
    static const char* names[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                  "bool", "string", "array", "u64", "i64", "f64"};
    return known_type(uint32_t(t)) ? names[uint32_t(t)] : "?";
}

const char* tensor_type_name(TensorType t) {
    switch (t) {
        case TensorType::F32:
            return "F32";
        case TensorType::F16:
            return "F16";
        case TensorType::Q8_0:
            return "Q8_0";
        case TensorType::BF16:
            return "BF16";
    }
    return "?";
}

uint64_t tensor_bytes(TensorType t, uint64_t n) {
    switch (t) {
        case TensorType::F32:
            return n * 4;
        case TensorType::F16:
        case TensorType::BF16:
            return n * 2;
        case TensorType::Q8_0:
            return n / kQ8Block * (2 + kQ8Block);
    }
    return 0;
}

namespace {
Value scalar(Type t, int64_t i, double f) {
    Value r;
    r.type = t;
    r.i = i;
    r.f = f;
    return r;
}
}  // namespace

Value Value::u32(uint32_t v) {
    return scalar(Type::U32, v, 0.0);
}
Value Value::i32(int32_t v) {
    return scalar(Type::I32, v, 0.0);
}
Value Value::f32(float v) {
    return scalar(Type::F32, 0, v);
}
Value Value::boolean(bool v) {
    return scalar(Type::Bool, v, 0.0);
}
Value Value::str(std::string v) {
    Value r;
    r.type = Type::String;
    r.s = std::move(v);
    return r;
}
Value Value::strings(std::vector<std::string> v) {
    Value r;
    r.type = Type::Array;
    r.elem = Type::String;
    r.strs = std::move(v);
    return r;
}
Value Value::i32s(const std::vector<int32_t>& v) {
    Value r;
    r.type = Type::Array;
    r.elem = Type::I32;
    r.ints.assign(v.begin(), v.end());
    return r;
}
Value Value::f32s(const std::vector<float>& v) {
    Value r;
    r.type = Type::Array;
    r.elem = Type::F32;
    r.floats.assign(v.begin(), v.end());
    return r;
}
bool Value::is_int() const {
    return type != Type::Array && type != Type::String && !is_float();
}
bool Value::is_float() const {
    return type == Type::F32 || type == Type::F64;
}
size_t Value::size() const {
    return elem == Type::String                       ? strs.size()
           : (elem == Type::F32 || elem == Type::F64) ? floats.size()
                                                      : ints.size();
}

uint64_t TensorInfo::numel() const {
    uint64_t n = 1;
    for (uint64_t d : ne) n *= d;
    return n;
}
std::string TensorInfo::shape() const {
    std::string s = "[";
    for (size_t k = 0; k < ne.size(); k++) s += (k ? ", " : "") + std::to_string(ne[k]);
    return s + "]";
}

// ---- Writer

void Writer::set(const std::string& key, Value v) {
    for (auto& [k, old] : kv_)
        if (k == key) {
            old = std::move(v);
            return;
        }
    kv_.emplace_back(key, std::move(v));
}

void Writer::add_tensor(std::string name, std::vector<uint64_t> ne, TensorType type,
                        std::function<void(uint8_t*)> fill) {
    ANVIL_ASSERT(!ne.empty() && ne.size() <= kMaxDims);
    Pending p{{std::move(name), std::move(ne), type, 0}, std::move(fill)};
    ANVIL_ASSERT(type != TensorType::Q8_0 || p.info.ne[0] % kQ8Block == 0);
    tensors_.push_back(std::move(p));
}

void Writer::write(const std::string& path, const std::function<void(size_t, size_t)>& progress) {
    std::string head;
    put(head, kMagic);
    put(head, kVersion);
    put(head, uint64_t(tensors_.size()));
    put(head, uint64_t(kv_.size()));
    for (const auto& [k, v] : kv_) {
        put_string(head, k);
        put_value(head, v);
    }
    uint64_t offset = 0;
    for (Pending& p : tensors_) {
        p.info.offset = offset;
        put_string(head, p.info.name);
        put(head, uint32_t(p.info.ne.size()));
        for (uint64_t d : p.info.ne) put(head, d);
        put(head, uint32_t(p.info.type));
        put(head, offset);
        offset = align_up(offset + tensor_bytes(p.info.type, p.info.numel()), kAlignment);
    }
    head.resize(align_up(head.size(), kAlignment), '\0');
    AtomicFile f(path);
    f.write(head.data(), head.size());
    std::vector<uint8_t> buf;
    for (size_t k = 0; k < tensors_.size(); k++) {
        const TensorInfo& t = tensors_[k].info;
        const uint64_t n = tensor_bytes(t.type, t.numel());
        buf.assign(size_t(align_up(n, kAlignment)), 0);
        tensors_[k].fill(buf.data());
        f.write(buf.data(), buf.size());
        if (progress) progress(k + 1, tensors_.size());
    }
    f.commit();
}

// ---- Reader

Reader::Reader(const std::string& path) : file_(std::make_unique<MappedFile>(path)), what_(path) {
    data_ = file_->data();
    size_ = file_->size();
    parse();
}

Reader::Reader(const uint8_t* data, size_t size, std::string what)
    : data_(data), size_(size), what_(std::move(what)) {
    parse();
}

Reader::~Reader() = default;

void Reader::parse() {
    Cursor c(data_, size_, what_);
    if (size_ < 4 || c.get<uint32_t>("the magic") != kMagic)
        fail("{}: not a GGUF file (it does not start with \"GGUF\")", what_);
    version_ = c.get<uint32_t>("the version");
    if (version_ != 2 && version_ != 3)
        fail("{}: GGUF version {}: anvil reads versions 2 and 3 (convert it with a current llama.cpp)", what_,
             version_);
    const uint64_t n_tensors = c.get<uint64_t>("the tensor count");
    const uint64_t n_kv = c.get<uint64_t>("the metadata count");
    // a key/value pair takes at least 12 bytes, a tensor's description at least 24
    if (n_kv > c.left() / 12)
        c.bad("the metadata count", fmt::format("{} is more than the file holds", n_kv));
    for (uint64_t k = 0; k < n_kv; k++) {
        std::string key = c.string(fmt::format("metadata key {}", k));
        Value v = get_value(c, key);
        kv_.emplace_back(std::move(key), std::move(v));
    }
    uint64_t align = kAlignment;
    if (const Value* a = find("general.alignment")) {
        if (!a->is_int() || a->i <= 0 || a->i > (1 << 20) || (a->i & (a->i - 1)))
            c.bad("general.alignment", "is not a power of two");
        align = uint64_t(a->i);
    }
    if (n_tensors > c.left() / 24)
        c.bad("the tensor count", fmt::format("{} is more than the file holds", n_tensors));
    for (uint64_t k = 0; k < n_tensors; k++) {
        TensorInfo t;
        t.name = c.string(fmt::format("tensor {}'s name", k));
        const uint32_t nd = c.get<uint32_t>(t.name + "'s dimension count");
        if (nd == 0 || nd > kMaxDims) c.bad(t.name, fmt::format("has {} dimensions (1 to 4)", nd));
        uint64_t numel = 1;
        for (uint32_t d = 0; d < nd; d++) {
            const uint64_t n = c.get<uint64_t>(t.name + "'s dimensions");
            if (n == 0 || n > (uint64_t(1) << 40) || numel > (uint64_t(1) << 40) / n)
                c.bad(t.name, fmt::format("has a dimension of {}", n));
            numel *= n;
            t.ne.push_back(n);
        }
        const uint32_t type = c.get<uint32_t>(t.name + "'s type");
        if (type != 0 && type != 1 && type != 8 && type != 30)
            fail(
                "{}: tensor {} is of ggml type {}: anvil reads F32, F16, BF16 and Q8_0 (requantize it with "
                "llama-quantize to Q8_0, or export F16 from the original model)",
                what_, t.name, type);
        t.type = TensorType(type);
        if (t.type == TensorType::Q8_0 && t.ne[0] % kQ8Block != 0)
            c.bad(t.name, "is Q8_0 with rows that are not whole blocks of 32");
        t.offset = c.get<uint64_t>(t.name + "'s offset");
        if (t.offset % align != 0) c.bad(t.name, "has an offset that is not aligned");
        tensors_.push_back(std::move(t));
    }
    data_start_ = align_up(c.pos(), align);
    const uint64_t data_bytes = size_ >= data_start_ ? size_ - data_start_ : 0;
    for (const TensorInfo& t : tensors_) {
        const uint64_t n = tensor_bytes(t.type, t.numel());
        if (t.offset > data_bytes || n > data_bytes - t.offset)
            fail(
                "{}: tensor {} ({} bytes at data offset {}) runs past the end of the file ({} data bytes): "
                "the file is truncated; copy or export it again",
                what_, t.name, n, t.offset, data_bytes);
    }
}

const Value* Reader::find(const std::string& key) const {
    for (const auto& [k, v] : kv_)
        if (k == key) return &v;
    return nullptr;
}

namespace {
const Value& need(const Reader& r, const std::string& key) {
    const Value* v = r.find(key);
    if (!v) fail("{}: the metadata has no {}", r.what(), key);
    return *v;
}
}  // namespace

int64_t Reader::get_int(const std::string& key) const {
    const Value& v = need(*this, key);
    if (!v.is_int()) fail("{}: {} is a {}, not an integer", what_, key, type_name(v.type));
    return v.i;
}

double Reader::get_float(const std::string& key) const {
    const Value& v = need(*this, key);
    if (v.is_int()) return double(v.i);
    if (!v.is_float()) fail("{}: {} is a {}, not a number", what_, key, type_name(v.type));
    return v.f;
}

const std::string& Reader::get_string(const std::string& key) const {
    const Value& v = need(*this, key);
    if (v.type != Type::String) fail("{}: {} is a {}, not a string", what_, key, type_name(v.type));
    return v.s;
}

const Value& Reader::get_array(const std::string& key, Type elem) const {
    const Value& v = need(*this, key);
    const bool num = elem != Type::String && v.elem != Type::String &&
                     (elem == Type::F32) == (v.elem == Type::F32 || v.elem == Type::F64);
    if (v.type != Type::Array || (v.elem != elem && !num))
        fail("{}: {} is not an array of {}", what_, key, type_name(elem));
    return v;
}

const TensorInfo* Reader::tensor(const std::string& name) const {
    for (const TensorInfo& t : tensors_)
        if (t.name == name) return &t;
    return nullptr;
}

std::vector<float> Reader::read_f32(const TensorInfo& t) const {
    const uint8_t* src = data_ + data_start_ + t.offset;
    const uint64_t n = t.numel();
    std::vector<float> out(static_cast<size_t>(n));
    switch (t.type) {
        case TensorType::F32:
            std::memcpy(out.data(), src, size_t(n) * 4);
            break;
        case TensorType::F16:
            convert_to_f32(out.data(), src, DType::F16, size_t(n));
            break;
        case TensorType::BF16:
            convert_to_f32(out.data(), src, DType::BF16, size_t(n));
            break;
        case TensorType::Q8_0:
            dequantize_q8_0(src, out.data(), n);
            break;
    }
    return out;
}

void quantize_q8_0(const float* x, uint8_t* out, uint64_t n) {
    for (uint64_t b = 0; b < n / kQ8Block; b++, x += kQ8Block, out += 2 + kQ8Block) {
        float amax = 0.0f;
        for (int k = 0; k < kQ8Block; k++) amax = std::max(amax, std::fabs(x[k]));
        const float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        const f16 h = to_f16(d);
        std::memcpy(out, &h, 2);
        for (int k = 0; k < kQ8Block; k++) out[2 + k] = uint8_t(int8_t(std::lround(x[k] * id)));
    }
}

void dequantize_q8_0(const uint8_t* in, float* y, uint64_t n) {
    for (uint64_t b = 0; b < n / kQ8Block; b++, in += 2 + kQ8Block, y += kQ8Block) {
        f16 h;
        std::memcpy(&h, in, 2);
        const float d = from_f16(h);
        for (int k = 0; k < kQ8Block; k++) y[k] = d * float(int8_t(in[2 + k]));
    }
}

}  // namespace anvil::gguf
