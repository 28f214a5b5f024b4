#include "io/checksum.h"

#include <zlib.h>

#include <fmt/format.h>
#include <filesystem>

#include "io/fs.h"

namespace anvil {

uint32_t file_crc32(const std::string& path) {
    const MappedFile f(path);
    const uLong empty = crc32_z(0, Z_NULL, 0);
    return uint32_t(f.size() == 0 ? empty : crc32_z(empty, f.data(), f.size()));
}

nlohmann::json file_manifest(const std::string& dir, const std::vector<std::string>& names) {
    nlohmann::json m = nlohmann::json::object();
    for (const std::string& n : names) {
        const std::string p = dir + "/" + n;
        m[n] = {{"bytes", std::filesystem::file_size(p)}, {"crc32", fmt::format("{:08x}", file_crc32(p))}};
    }
    return m;
}

std::string check_manifest(const std::string& dir, const nlohmann::json& manifest) {
    for (const auto& [name, want] : manifest.items()) {
        const std::string p = dir + "/" + name;
        if (!file_exists(p)) return name + ": missing";
        const uint64_t bytes = std::filesystem::file_size(p), want_bytes = want.value("bytes", uint64_t(0));
        if (bytes != want_bytes)
            return fmt::format("{}: {} bytes, the manifest says {} (truncated or replaced)", name, bytes,
                               want_bytes);
        const std::string crc = fmt::format("{:08x}", file_crc32(p));
        if (crc != want.value("crc32", std::string()))
            return fmt::format("{}: CRC-32 {}, the manifest says {} (its bytes changed)", name, crc,
                               want.value("crc32", std::string()));
    }
    return "";
}

}  // namespace anvil
