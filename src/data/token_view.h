// TokenView: read-only random access to a token stream (ids and per-token flags) laid out in one or more
// contiguous segments: an in-memory TokenStream, or memory-mapped shards of 16- or 32-bit ids.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace anvil {

// Per-token flags.
enum TokenFlag : uint8_t {
    kInLoss = 1,       // the token is a prediction target
    kNeedsPrompt = 2,  // ... but only when its record's start is inside the row (instruction outputs)
    kRecordStart = 4,  // first token of a record
};

struct TokenSegment {
    const void* ids = nullptr;       // uint16_t or int32_t/uint32_t
    int width = 4;                   // bytes per id: 2 or 4
    const uint8_t* flags = nullptr;  // per-token TokenFlag bits; null = plain text: every token in the loss,
    int32_t eot = -1;                // and a record starts at the segment's start and after each `eot`
    size_t n = 0;
};

class TokenView {
public:
    TokenView() = default;
    explicit TokenView(std::vector<TokenSegment> segs) : segs_(std::move(segs)) {
        starts_.push_back(0);
        for (const auto& s : segs_) starts_.push_back(starts_.back() + s.n);
    }
    size_t size() const { return starts_.empty() ? 0 : starts_.back(); }
    bool empty() const { return size() == 0; }

    int32_t id(size_t i) const {
        const auto [s, k] = locate(i);
        return id_in(*s, k);
    }
    uint8_t flags(size_t i) const {
        const auto [s, k] = locate(i);
        if (s->flags) return s->flags[k];
        return uint8_t(kInLoss | (k == 0 || id_in(*s, k - 1) == s->eot ? kRecordStart : 0));
    }
    const std::vector<TokenSegment>& segments() const { return segs_; }

private:
    static int32_t id_in(const TokenSegment& s, size_t k) {
        return s.width == 2 ? int32_t(static_cast<const uint16_t*>(s.ids)[k])
                            : static_cast<const int32_t*>(s.ids)[k];
    }
    std::pair<const TokenSegment*, size_t> locate(size_t i) const {
        if (segs_.size() == 1) return {&segs_[0], i};
        const size_t k = size_t(std::upper_bound(starts_.begin(), starts_.end(), i) - starts_.begin()) - 1;
        return {&segs_[k], i - starts_[k]};
    }
    std::vector<TokenSegment> segs_;
    std::vector<size_t> starts_;
};

// A token stream in memory: ids and their flags.
struct TokenStream {
    std::vector<int32_t> ids;
    std::vector<uint8_t> flags;  // TokenFlag bits
    size_t size() const { return ids.size(); }
    void append(const std::vector<int32_t>& t, uint8_t flag) {
        ids.insert(ids.end(), t.begin(), t.end());
        flags.insert(flags.end(), t.size(), flag);
    }
    void append_one(int32_t id, uint8_t flag) {
        ids.push_back(id);
        flags.push_back(flag);
    }
    TokenView view() const { return TokenView({TokenSegment{ids.data(), 4, flags.data(), -1, ids.size()}}); }
    operator TokenView() const { return view(); }
};

}  // namespace anvil
