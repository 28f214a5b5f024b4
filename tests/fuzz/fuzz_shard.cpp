// libFuzzer: any bytes as a shard file image. Validation never reads out of bounds; an image it accepts can
// be read through a TokenView end to end with every id inside the vocabulary.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "data/shard.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    // a copy, aligned as an mmap would be
    std::vector<uint64_t> buf((size + 7) / 8 + 1);
    std::memcpy(buf.data(), data, size);
    const auto* d = reinterpret_cast<const uint8_t*>(buf.data());
    if (!anvil::validate_shard_bytes(d, size).empty()) return 0;
    uint32_t width, vocab, has_flags;
    uint64_t count;
    std::memcpy(&width, d + 12, 4);
    std::memcpy(&vocab, d + 16, 4);
    std::memcpy(&has_flags, d + 20, 4);
    std::memcpy(&count, d + 24, 8);
    anvil::TokenSegment s;
    s.ids = d + anvil::kShardHeaderBytes;
    s.width = int(width);
    s.flags = has_flags ? d + anvil::kShardHeaderBytes + count * width : nullptr;
    s.eot = 0;
    s.n = size_t(count);
    const anvil::TokenView v({s});
    for (size_t i = 0; i < v.size(); i++) {
        if (v.id(i) < 0 || uint32_t(v.id(i)) >= vocab) std::abort();
        (void)v.flags(i);
    }
    return 0;
}
