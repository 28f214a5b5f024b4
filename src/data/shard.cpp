#include "data/shard.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace anvil {

namespace {
constexpr char kMagic[8] = {'A', 'N', 'V', 'I', 'L', 'T', 'O', 'K'};
constexpr uint32_t kVersion = 1;

template <typename T>
T load(const uint8_t* p) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
template <typename T>
void store(uint8_t* p, T v) {
    std::memcpy(p, &v, sizeof v);
}

void write_all(std::FILE* f, const void* p, size_t n, const std::string& path) {
    ANVIL_CHECK(std::fwrite(p, 1, n, f) == n, "{}: write failed ({}); check free disk space", path,
                std::strerror(errno));
}
}  // namespace

ShardWriter::ShardWriter(std::string path, int vocab_size, bool with_flags)
    : path_(std::move(path)),
      vocab_(vocab_size),
      width_(vocab_size <= 65536 ? 2 : 4),
      with_flags_(with_flags) {
    tmp_ = path_ + ".tmp." + std::to_string(::getpid());
    f_ = std::fopen(tmp_.c_str(), "wb");
    ANVIL_CHECK(f_, "{}: cannot create ({})", tmp_, std::strerror(errno));
    const uint8_t zero[kShardHeaderBytes] = {};
    write_all(f_, zero, sizeof zero, tmp_);  // the header is written at close, when the counts are known
    if (with_flags_) {
        flags_tmp_ = tmp_ + ".flags";
        ff_ = std::fopen(flags_tmp_.c_str(), "wb+");
        ANVIL_CHECK(ff_, "{}: cannot create ({})", flags_tmp_, std::strerror(errno));
    }
}

ShardWriter::~ShardWriter() {
    if (f_) {  // not closed: an error happened; leave nothing behind
        std::fclose(f_);
        std::remove(tmp_.c_str());
    }
    if (ff_) {
        std::fclose(ff_);
        std::remove(flags_tmp_.c_str());
    }
}

void ShardWriter::append(const int32_t* ids, const uint8_t* flags, size_t n) {
    if (width_ == 2) {
        std::vector<uint16_t> narrow(n);
        for (size_t i = 0; i < n; i++) narrow[i] = uint16_t(ids[i]);
        write_all(f_, narrow.data(), n * 2, tmp_);
    } else {
        write_all(f_, ids, n * 4, tmp_);
    }
    if (with_flags_) write_all(ff_, flags, n, flags_tmp_);
    count_ += n;
}

void ShardWriter::close() {
    if (with_flags_) {  // append the flags after the ids
        std::rewind(ff_);
        std::vector<uint8_t> buf(1 << 20);
        size_t got;
        while ((got = std::fread(buf.data(), 1, buf.size(), ff_)) > 0) write_all(f_, buf.data(), got, tmp_);
        std::fclose(ff_);
        ff_ = nullptr;
        std::remove(flags_tmp_.c_str());
    }
    uint8_t h[kShardHeaderBytes] = {};
    std::memcpy(h, kMagic, 8);
    store<uint32_t>(h + 8, kVersion);
    store<uint32_t>(h + 12, uint32_t(width_));
    store<uint32_t>(h + 16, uint32_t(vocab_));
    store<uint32_t>(h + 20, with_flags_ ? 1u : 0u);
    store<uint64_t>(h + 24, count_);
    store<uint64_t>(h + 32, records_);
    std::rewind(f_);
    write_all(f_, h, sizeof h, tmp_);
    const bool ok = std::fflush(f_) == 0 && ::fsync(::fileno(f_)) == 0;
    std::fclose(f_);
    f_ = nullptr;
    if (!ok || std::rename(tmp_.c_str(), path_.c_str()) != 0) {
        std::remove(tmp_.c_str());
        fail("{}: could not be written ({})", path_, std::strerror(errno));
    }
}

std::string validate_shard_bytes(const uint8_t* d, size_t size) {
    if (size < kShardHeaderBytes)
        return "truncated shard: " + std::to_string(size) + " bytes, the header alone is 64";
    if (std::memcmp(d, kMagic, 8) != 0) return "not an anvil token shard (bad magic)";
    const uint32_t version = load<uint32_t>(d + 8), width = load<uint32_t>(d + 12),
                   vocab = load<uint32_t>(d + 16);
    const uint32_t has_flags = load<uint32_t>(d + 20);
    const uint64_t count = load<uint64_t>(d + 24);
    if (version != kVersion)
        return "shard version " + std::to_string(version) + " is not supported (this anvil reads 1)";
    if (width != 2 && width != 4) return "token width " + std::to_string(width) + " (must be 2 or 4)";
    if (has_flags > 1) return "has_flags is " + std::to_string(has_flags) + " (must be 0 or 1)";
    // ids are read as int32; anvil's models take vocabularies up to 2^24
    if (vocab == 0 || vocab > (1u << 24) || (width == 2 && vocab > 65536))
        return "vocabulary size " + std::to_string(vocab) + " is out of range (1.." +
               std::to_string(width == 2 ? 65536 : 1 << 24) + ")";
    const uint64_t per = width + has_flags;
    if (count > (size - kShardHeaderBytes) / per || kShardHeaderBytes + count * per != size)
        return "truncated or padded shard: the header says " + std::to_string(count) + " tokens (" +
               std::to_string(kShardHeaderBytes + count * per) + " bytes) but the file has " +
               std::to_string(size);
    const uint8_t* ids = d + kShardHeaderBytes;
    for (uint64_t i = 0; i < count; i++) {
        const uint32_t id = width == 2 ? load<uint16_t>(ids + 2 * i) : load<uint32_t>(ids + 4 * i);
        if (id >= vocab)
            return "token " + std::to_string(i) + " has id " + std::to_string(id) +
                   ", outside the vocabulary of " + std::to_string(vocab);
    }
    if (has_flags) {
        const uint8_t* fl = ids + count * width;
        for (uint64_t i = 0; i < count; i++)
            if (fl[i] & ~uint8_t(kInLoss | kNeedsPrompt | kRecordStart))
                return "token " + std::to_string(i) + " has unknown flag bits " + std::to_string(fl[i]);
    }
    return {};
}

Shard::Shard(const std::string& path) : path_(path), file_(path) {
    const uint8_t* d = file_.data();
    const std::string why = validate_shard_bytes(d, file_.size());
    ANVIL_CHECK(why.empty(), "{}: {}; re-run anvil data prepare", path, why);
    width_ = int(load<uint32_t>(d + 12));
    vocab_ = int(load<uint32_t>(d + 16));
    count_ = load<uint64_t>(d + 24);
    records_ = load<uint64_t>(d + 32);
    ids_ = d + kShardHeaderBytes;
    if (load<uint32_t>(d + 20)) flags_ = ids_ + count_ * uint64_t(width_);
}

TokenSegment Shard::segment(int32_t eot) const {
    TokenSegment s;
    s.ids = ids_;
    s.width = width_;
    s.flags = flags_;
    s.eot = eot;
    s.n = size_t(count_);
    return s;
}

}  // namespace anvil
