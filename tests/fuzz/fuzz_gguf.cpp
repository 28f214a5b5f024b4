// libFuzzer: any bytes as a GGUF file. The reader refuses what it cannot read with an InputError and never
// reads out of bounds; every tensor of a file it accepts converts to f32.
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "io/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::vector<uint8_t> copy(data, data + size);  // exactly `size` bytes: ASan sees any overread
    try {
        const anvil::gguf::Reader r(copy.data(), copy.size(), "fuzz");
        uint64_t total = 0;
        for (const anvil::gguf::TensorInfo& t : r.tensors()) {
            total += t.numel();
            if (total > (uint64_t(1) << 24)) break;  // a valid file may be large; the bounds are what matter
            (void)r.read_f32(t);
        }
    } catch (const anvil::InputError&) {
    }
    return 0;
}
