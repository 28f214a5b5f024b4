// libFuzzer: any bytes through a byte-level BPE (trained once on a small corpus) and GPT-2's pre-tokenizer.
// Pieces must tile the text; decoding must give back valid input exactly and repaired input otherwise.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "data/bpe.h"
#include "data/pretokenize.h"
#include "data/utf8.h"

static const anvil::BpeTokenizer& tokenizer() {
    static const anvil::BpeTokenizer t = anvil::train_bpe(
        {"the quick brown fox jumps over the lazy dog; it's 2026, isn't it? 123 4567 日本語 😀 ",
         "def f(x):\n    return x ** 2\n\n  spaces   and\ttabs\r\n ééé ååå"},
        600, false);
    return t;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    const bool valid = anvil::utf8::valid(text);
    const std::string fixed = valid ? text : anvil::utf8::repair(text);
    if (!anvil::utf8::valid(fixed)) std::abort();
    std::vector<uint32_t> ends;
    anvil::gpt2_pretokenize(fixed, ends);
    uint32_t prev = 0;
    for (uint32_t e : ends) {
        if (e <= prev || e > fixed.size()) std::abort();  // pieces are non-empty and in order
        prev = e;
    }
    if (prev != fixed.size()) std::abort();  // and cover the text
    const auto& t = tokenizer();
    const std::vector<int32_t> ids = t.encode(text);
    for (int32_t id : ids)
        if (id < 0 || id >= t.vocab_size()) std::abort();
    if (t.decode(ids) != fixed) std::abort();
    return 0;
}
