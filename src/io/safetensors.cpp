#include "io/safetensors.h"

#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/fs.h"

namespace anvil {

namespace {
constexpr uint64_t kMaxHeader = 100ull << 20;  // the format's own limit
}

int64_t StEntry::numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path), file_(path) {
    const size_t file_size = file_.size();
    ANVIL_CHECK(file_size >= 8, "{}: truncated safetensors file ({} bytes; the header length alone takes 8)",
                path, file_size);
    const uint8_t* bytes = file_.data();
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | bytes[i];
    ANVIL_CHECK(hlen <= kMaxHeader && hlen <= file_size - 8,
                "{}: header claims {} bytes but the file holds {} after the length; the file is truncated or "
                "not safetensors",
                path, hlen, file_size - 8);
    nlohmann::json header;
    try {
        header = nlohmann::json::parse(bytes + 8, bytes + 8 + hlen);
    } catch (const nlohmann::json::exception& e) {
        fail("{}: header is not valid JSON ({}); the file is corrupt or not safetensors", path, e.what());
    }
    ANVIL_CHECK(header.is_object(), "{}: header must be a JSON object", path);
    data_ = bytes + 8 + hlen;
    const uint64_t data_len = file_size - 8 - hlen;
    for (auto it = header.begin(); it != header.end(); ++it) {
        const std::string& name = it.key();
        const auto& v = it.value();
        if (name == "__metadata__") {
            if (v.is_object())
                for (auto m = v.begin(); m != v.end(); ++m)
                    if (m.value().is_string()) metadata_[m.key()] = m.value().get<std::string>();
            continue;
        }
        ANVIL_CHECK(v.is_object() && v.contains("dtype") && v["dtype"].is_string() && v.contains("shape") &&
                        v["shape"].is_array() && v.contains("data_offsets") && v["data_offsets"].is_array() &&
                        v["data_offsets"].size() == 2,
                    "{}: tensor \"{}\" has a malformed header entry", path, name);
        StEntry e;
        e.name = name;
        e.dtype_name = v["dtype"].get<std::string>();
        e.known = dtype_from_name(e.dtype_name, &e.dtype);
        uint64_t numel = 1;
        for (const auto& d : v["shape"]) {
            ANVIL_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0),
                        "{}: tensor \"{}\" has a negative or non-integer dimension", path, name);
            const uint64_t x = d.get<uint64_t>();
            ANVIL_CHECK(x == 0 || numel <= (uint64_t(1) << 62) / x, "{}: tensor \"{}\" shape overflows", path,
                        name);
            numel *= x;
            e.shape.push_back(int64_t(x));
        }
        for (const auto& o : v["data_offsets"])
            ANVIL_CHECK(o.is_number_unsigned() || (o.is_number_integer() && o.get<int64_t>() >= 0),
                        "{}: tensor \"{}\" has invalid data_offsets", path, name);
        e.begin = v["data_offsets"][0].get<uint64_t>();
        e.end = v["data_offsets"][1].get<uint64_t>();
        ANVIL_CHECK(
            e.begin <= e.end && e.end <= data_len,
            "{}: tensor \"{}\" claims bytes {}..{} but the data section has {}; the file is truncated or "
            "its header lies",
            path, name, e.begin, e.end, data_len);
        if (e.known)
            ANVIL_CHECK(
                e.end - e.begin == numel * dtype_size(e.dtype),
                "{}: tensor \"{}\": the header lies about sizes ({} elements of {} need {} bytes, its "
                "data_offsets span {}); the file is corrupt",
                path, name, numel, e.dtype_name, numel * dtype_size(e.dtype), e.end - e.begin);
        entries_.push_back(std::move(e));
    }
}

const StEntry* SafetensorsReader::find(const std::string& name) const {
    for (const auto& e : entries_)
        if (e.name == name) return &e;
    return nullptr;
}

std::vector<float> SafetensorsReader::read_f32(const StEntry& e) const {
    ANVIL_CHECK(e.known && (e.dtype == DType::F32 || e.dtype == DType::BF16 || e.dtype == DType::F16),
                "{}: tensor \"{}\" has dtype {}; anvil reads F32, BF16 and F16 weights", path_, e.name,
                e.dtype_name);
    std::vector<float> out(size_t(e.numel()));
    convert_to_f32(out.data(), data_ + e.begin, e.dtype, out.size());
    return out;
}

int64_t StMeta::numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

namespace {
std::string header_bytes(const std::vector<StMeta>& tensors, const std::map<std::string, std::string>& metadata) {
    nlohmann::ordered_json header = nlohmann::ordered_json::object();
    if (!metadata.empty()) header["__metadata__"] = metadata;
    uint64_t off = 0;
    for (const auto& t : tensors) {
        const uint64_t bytes = uint64_t(t.numel()) * dtype_size(t.dtype);
        header[t.name] = {
            {"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape}, {"data_offsets", {off, off + bytes}}};
        off += bytes;
    }
    std::string h = header.dump();
    while ((8 + h.size()) % 8 != 0) h.push_back(' ');  // keep the data section 8-byte aligned
    std::string out;
    const uint64_t hl = h.size();
    for (int i = 0; i < 8; i++) out.push_back(char((hl >> (8 * i)) & 0xff));
    return out + h;
}
}  // namespace

void write_safetensors_streamed(const std::string& path, const std::vector<StMeta>& tensors,
                                const std::function<void(size_t, void*)>& fetch,
                                const std::map<std::string, std::string>& metadata) {
    AtomicFile f(path);
    const std::string h = header_bytes(tensors, metadata);
    f.write(h.data(), h.size());
    std::vector<uint8_t> buf;
    for (size_t i = 0; i < tensors.size(); i++) {
        buf.resize(size_t(tensors[i].numel()) * dtype_size(tensors[i].dtype));
        fetch(i, buf.data());
        f.write(buf.data(), buf.size());
    }
    f.commit();
}

void write_safetensors(const std::string& path, const std::vector<StTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
    std::vector<StMeta> metas;
    for (const auto& t : tensors) metas.push_back({t.name, t.dtype, t.shape});
    write_safetensors_streamed(
        path, metas,
        [&](size_t i, void* dst) {
            std::memcpy(dst, tensors[i].data, size_t(metas[i].numel()) * dtype_size(metas[i].dtype));
        },
        metadata);
}

}  // namespace anvil
