// GGUF, the file format of llama.cpp and what is built on it (Ollama, LM Studio, llama-cpp-python): a header,
// typed key/value metadata, the tensors' descriptions, then their data, each tensor at an aligned offset.
// Version 3, little-endian. This file knows the container only; runtime/gguf_model.h maps models onto it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace anvil {
class MappedFile;
}

namespace anvil::gguf {

// Metadata value types, as the file numbers them.
enum class Type : uint32_t {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
};
const char* type_name(Type t);

// The tensor types anvil writes and reads (ggml's numbering).
enum class TensorType : uint32_t { F32 = 0, F16 = 1, Q8_0 = 8, BF16 = 30 };
const char* tensor_type_name(TensorType t);
// Bytes of n elements; Q8_0 holds blocks of 32 (an f16 scale, then 32 int8s): n must be a multiple of 32.
uint64_t tensor_bytes(TensorType t, uint64_t n);
constexpr int kQ8Block = 32;

// One metadata value: a scalar (integers in i, floats in f, a string in s) or an array of one element type
// (in ints, floats or strs by that type).
struct Value {
    Type type = Type::U32;
    Type elem = Type::U8;  // an array's element type
    int64_t i = 0;
    double f = 0.0;
    std::string s;
    std::vector<int64_t> ints;
    std::vector<double> floats;
    std::vector<std::string> strs;

    static Value u32(uint32_t v);
    static Value i32(int32_t v);
    static Value f32(float v);
    static Value boolean(bool v);
    static Value str(std::string v);
    static Value strings(std::vector<std::string> v);
    static Value i32s(const std::vector<int32_t>& v);
    static Value f32s(const std::vector<float>& v);
    bool is_int() const;    // a scalar of an integer type (or bool)
    bool is_float() const;  // F32 or F64
    size_t size() const;    // an array's element count
};

struct TensorInfo {
    std::string name;
    std::vector<uint64_t> ne;  // ggml's dimensions: ne[0] varies fastest (a row's length)
    TensorType type = TensorType::F32;
    uint64_t offset = 0;  // from the start of the data section
    uint64_t numel() const;
    std::string shape() const;  // "[ne0, ne1]"
};

// A GGUF file built in memory, its tensors' bytes produced one at a time while it is written.
class Writer {
public:
    void set(const std::string& key, Value v);  // replaces an earlier value of the key
    // fill(dst) writes the tensor's tensor_bytes(type, numel) bytes when the file is written.
    void add_tensor(std::string name, std::vector<uint64_t> ne, TensorType type,
                    std::function<void(uint8_t* dst)> fill);
    // To a temporary file renamed over `path` once complete (io/fs.h's AtomicFile); `progress` (may be empty)
    // sees the tensors written.
    void write(const std::string& path, const std::function<void(size_t done, size_t total)>& progress = {});

private:
    std::vector<std::pair<std::string, Value>> kv_;
    struct Pending {
        TensorInfo info;
        std::function<void(uint8_t*)> fill;
    };
    std::vector<Pending> tensors_;
};

// A GGUF file read and checked: every count, length, dimension and offset bounded by the file, the data of
// every tensor inside it. A bad file is an error naming the file and the field.
class Reader {
public:
    explicit Reader(const std::string& path);
    // From bytes held by the caller (kept alive while the reader is used); `what` names them in errors.
    Reader(const uint8_t* data, size_t size, std::string what);
    ~Reader();

    uint32_t version() const { return version_; }
    const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }
    const Value* find(const std::string& key) const;
    // The key's value, an error naming the key when it is missing or of another kind.
    int64_t get_int(const std::string& key) const;
    double get_float(const std::string& key) const;  // a float or an integer
    const std::string& get_string(const std::string& key) const;
    const Value& get_array(const std::string& key, Type elem) const;

    const std::vector<TensorInfo>& tensors() const { return tensors_; }
    const TensorInfo* tensor(const std::string& name) const;
    // The tensor's values as f32 (F16, BF16 and Q8_0 converted), ne[0] fastest.
    std::vector<float> read_f32(const TensorInfo& t) const;
    const std::string& what() const { return what_; }

private:
    void parse();

    std::unique_ptr<MappedFile> file_;
    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
    std::string what_;
    uint32_t version_ = 0;
    uint64_t data_start_ = 0;
    std::vector<std::pair<std::string, Value>> kv_;
    std::vector<TensorInfo> tensors_;
};

// Q8_0 as ggml defines it: per block of 32, d = max|x| / 127 (stored as f16), q = round(x / d).
void quantize_q8_0(const float* x, uint8_t* out, uint64_t n);
void dequantize_q8_0(const uint8_t* in, float* y, uint64_t n);

}  // namespace anvil::gguf
