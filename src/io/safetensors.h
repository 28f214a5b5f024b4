// safetensors: an 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}},
// then the raw tensor bytes. The reader checks every claim the header makes against the file before any
// tensor is used, so a truncated file or a lying header gives an error naming the file and the tensor.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/fs.h"

namespace anvil {

struct StEntry {
    std::string name;
    std::string dtype_name;  // as written in the file
    bool known = false;      // dtype is one anvil reads
    DType dtype = DType::F32;
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;  // byte offsets into the data section
    int64_t numel() const;
};

class SafetensorsReader {
public:
    explicit SafetensorsReader(const std::string& path);

    const std::string& path() const { return path_; }
    const std::vector<StEntry>& entries() const { return entries_; }
    const StEntry* find(const std::string& name) const;
    const std::map<std::string, std::string>& metadata() const { return metadata_; }
    // The tensor's elements converted to f32 (F32, BF16, F16 sources).
    std::vector<float> read_f32(const StEntry& e) const;
    const uint8_t* raw(const StEntry& e) const { return data_ + e.begin; }

private:
    std::string path_;
    MappedFile file_;
    const uint8_t* data_ = nullptr;  // start of the data section
    std::vector<StEntry> entries_;
    std::map<std::string, std::string> metadata_;
};

struct StTensor {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    const void* data;  // host memory, numel * dtype_size bytes
};

// Writes atomically (temporary file, then rename). Tensors are laid out in the given order.
void write_safetensors(const std::string& path, const std::vector<StTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// The same, one tensor at a time: `fetch(i, dst)` fills tensor i's numel * dtype_size bytes at dst (a buffer
// of that tensor's size), so only one tensor is ever held on the host.
struct StMeta {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    int64_t numel() const;
};
void write_safetensors_streamed(const std::string& path, const std::vector<StMeta>& tensors,
                                const std::function<void(size_t, void*)>& fetch,
                                const std::map<std::string, std::string>& metadata = {});

}  // namespace anvil
