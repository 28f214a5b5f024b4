// Checksums of what anvil writes, so a damaged file is named instead of read: each file's size and CRC-32
// (zlib's, the checksum of zip, gzip and PNG), kept beside the files in a manifest (a JSON object of file
// name to {"bytes", "crc32"}). A training checkpoint keeps its manifest in trainer_state.json; prepared data
// keeps one for its shards.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace anvil {

// The CRC-32 of a file's bytes (read through a mapping); throws naming the file if it cannot be read.
uint32_t file_crc32(const std::string& path);

// {"NAME": {"bytes": N, "crc32": "8 hex digits"}, ...} for these files of `dir`.
nlohmann::json file_manifest(const std::string& dir, const std::vector<std::string>& names);

// Checks the files of `dir` against a manifest: "" when every one is there with its size and checksum, else
// what is wrong with the first that is not ("model.safetensors: 1048576 bytes, the manifest says 498795008").
std::string check_manifest(const std::string& dir, const nlohmann::json& manifest);

}  // namespace anvil
