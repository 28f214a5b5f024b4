// Token shards: the binary files `anvil data prepare` writes and training memory-maps.
//
// Layout (little-endian):
//   bytes 0..63   header: magic "ANVILTOK", u32 version (1), u32 token width in bytes (2 or 4),
//                 u32 vocabulary size, u32 has_flags (0 or 1), u64 token count, u64 record count,
//                 24 reserved zero bytes
//   then          count token ids (uint16 or uint32)
//   then          if has_flags: count flag bytes (TokenFlag bits: in loss, needs prompt, record start)
// Files are written to a temporary name and renamed when complete.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "data/token_view.h"
#include "io/fs.h"

namespace anvil {

constexpr size_t kShardHeaderBytes = 64;

class ShardWriter {
public:
    // Token width: 2 bytes when vocab_size <= 65536, else 4.
    ShardWriter(std::string path, int vocab_size, bool with_flags);
    ~ShardWriter();
    ShardWriter(const ShardWriter&) = delete;
    ShardWriter& operator=(const ShardWriter&) = delete;

    void append(const int32_t* ids, const uint8_t* flags, size_t n);
    void end_record() { records_++; }
    // Writes the header and moves the file into place. Until then nothing exists at `path`.
    void close();
    uint64_t tokens() const { return count_; }
    const std::string& path() const { return path_; }

private:
    std::string path_, tmp_, flags_tmp_;
    int vocab_;
    int width_;
    bool with_flags_;
    std::FILE* f_ = nullptr;
    std::FILE* ff_ = nullptr;
    uint64_t count_ = 0, records_ = 0;
};

// A memory-mapped shard, checked on open: magic, version, width, sizes against the file length, every id
// below the vocabulary size and every flag byte known. Errors name the file and what is wrong.
class Shard {
public:
    explicit Shard(const std::string& path);

    // The shard as a view segment; `eot` marks record boundaries when the shard has no flag bytes.
    TokenSegment segment(int32_t eot) const;
    uint64_t tokens() const { return count_; }
    uint64_t records() const { return records_; }
    int vocab_size() const { return vocab_; }
    int width() const { return width_; }
    bool has_flags() const { return flags_ != nullptr; }
    const std::string& path() const { return path_; }

private:
    std::string path_;
    MappedFile file_;
    const uint8_t* ids_ = nullptr;
    const uint8_t* flags_ = nullptr;
    uint64_t count_ = 0, records_ = 0;
    int vocab_ = 0, width_ = 0;
};

// Checks a shard image in memory (what Shard does after mapping); the fuzz target drives this.
// Returns an empty string when valid, else the reason.
std::string validate_shard_bytes(const uint8_t* data, size_t size);

}  // namespace anvil
