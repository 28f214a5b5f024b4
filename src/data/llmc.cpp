#include "data/llmc.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/hash.h"
#include "io/fs.h"

namespace anvil {

namespace {

namespace fsys = std::filesystem;

struct LlmcHeader {
    int32_t magic = 0, version = 0;
    int64_t count = 0;
    int width = 0;  // bytes per id, 0 when the magic is not llm.c's
};

LlmcHeader read_header(const uint8_t* d, size_t size) {
    LlmcHeader h;
    if (size < kLlmcHeaderBytes) return h;
    int32_t w[3];
    std::memcpy(w, d, sizeof(w));
    h.magic = w[0];
    h.version = w[1];
    h.count = w[2];
    if (h.magic == kLlmcMagicGpt2 && h.version == 1) h.width = 2;
    if (h.magic == kLlmcMagicLlama3 && h.version == 7) h.width = 4;
    return h;
}

// The split's files in name order: "train" or "val" in the name after an underscore.
std::vector<std::string> split_files(const std::string& dir, const char* split) {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& e : fsys::directory_iterator(dir, ec)) {
        const std::string name = e.path().filename().string();
        if (e.is_regular_file() && name.ends_with(".bin") &&
            name.find(std::string("_") + split) != std::string::npos)
            out.push_back(e.path().string());
    }
    std::sort(out.begin(), out.end());
    return out;
}

LlmcHeader header_of(const std::string& path) {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) return {};
    uint8_t buf[12];
    const size_t n = std::fread(buf, 1, sizeof(buf), f);
    std::fclose(f);
    std::error_code ec;
    const auto size = fsys::file_size(path, ec);
    return n == sizeof(buf) && !ec && size >= kLlmcHeaderBytes ? read_header(buf, kLlmcHeaderBytes)
                                                               : LlmcHeader{};
}

struct LlmcShard {
    explicit LlmcShard(const std::string& p, const Tokenizer& tok) : path(p), file(p) {
        const LlmcHeader h = read_header(file.data(), file.size());
        ANVIL_CHECK(h.width > 0,
                    "{}: not an llm.c token shard (magic {}, version {}; llm.c writes 20240520 version 1 or "
                    "20240801 version 7)",
                    path, h.magic, h.version);
        ANVIL_CHECK(
            h.count >= 0 && kLlmcHeaderBytes + uint64_t(h.count) * h.width == file.size(),
            "{}: the header counts {} tokens of {} bytes, but the file has {} bytes after its header; "
            "the file is truncated or damaged",
            path, h.count, h.width, file.size() - kLlmcHeaderBytes);
        width = h.width;
        count = size_t(h.count);
        ids = file.data() + kLlmcHeaderBytes;
        int64_t bad = -1;
        for (size_t i = 0; i < count && bad < 0; i++)
            if (id(i) >= uint32_t(tok.vocab_size())) bad = int64_t(i);
        ANVIL_CHECK(bad < 0,
                    "{}: token {} is id {}, outside the tokenizer's {} ids; give the tokenizer the "
                    "shards were written with ({})",
                    path, bad, id(size_t(bad)), tok.vocab_size(),
                    h.magic == kLlmcMagicGpt2 ? "GPT-2's" : "Llama 3's");
        magic = h.magic;
    }
    uint32_t id(size_t i) const {
        if (width == 2) {
            uint16_t s;
            std::memcpy(&s, ids + 2 * i, 2);
            return s;
        }
        uint32_t v;
        std::memcpy(&v, ids + 4 * i, 4);
        return v;
    }
    std::string path;
    MappedFile file;
    const uint8_t* ids = nullptr;
    size_t count = 0;
    int width = 0;
    int32_t magic = 0;
};

}  // namespace

bool is_llmc_dir(const std::string& path) {
    return dir_exists(path) && !file_exists(path + "/meta.json") && !split_files(path, "train").empty();
}

std::string llmc_tokenizer_name(const std::string& dir) {
    const std::vector<std::string> train = split_files(dir, "train");
    return !train.empty() && header_of(train.front()).magic == kLlmcMagicLlama3 ? "Llama 3" : "GPT-2";
}

Dataset open_llmc(const std::string& dir, const Tokenizer& tok) {
    struct Storage {
        std::vector<std::unique_ptr<LlmcShard>> shards;
    };
    auto st = std::make_shared<Storage>();
    uint64_t h = kFnvOffset;
    int32_t magic = 0;
    const auto view_of = [&](const char* split) {
        std::vector<TokenSegment> segs;
        for (const std::string& p : split_files(dir, split)) {
            st->shards.push_back(std::make_unique<LlmcShard>(p, tok));
            const LlmcShard& s = *st->shards.back();
            ANVIL_CHECK(magic == 0 || s.magic == magic,
                        "{}: magic {}, but the directory's first shard has {}", p, s.magic, magic);
            magic = s.magic;
            // the delimiter that opens every document: a record ends at it
            const int32_t delim = magic == kLlmcMagicGpt2 ? tok.eot_id() : tok.bos_id();
            ANVIL_CHECK(delim >= 0,
                        "{}: Llama 3 shards open each document with BOS, but the tokenizer has none", p);
            segs.push_back(TokenSegment{s.ids, s.width, nullptr, delim, s.count});
            for (const char c : fsys::path(p).filename().string()) h = fnv1a_mix(h, uint64_t(uint8_t(c)));
            h = fnv1a_mix(h, s.count);
            const size_t edge = std::min<size_t>(4096, s.count);
            for (size_t i = 0; i < edge; i++) h = fnv1a_mix(fnv1a_mix(h, s.id(i)), s.id(s.count - 1 - i));
        }
        return TokenView(std::move(segs));
    };
    Dataset d;
    d.path = dir;
    d.train = view_of("train");
    ANVIL_CHECK(!d.train.empty(), "{}: the llm.c training shards (*_train*.bin) hold no tokens", dir);
    d.fingerprint = h;  // of the training split: the validation files are read after it
    d.val = view_of("val");
    d.format = fmt::format("llm.c {} shards, {} files", magic == kLlmcMagicGpt2 ? "GPT-2" : "Llama 3",
                           st->shards.size());
    d.storage = st;
    return d;
}

}  // namespace anvil
