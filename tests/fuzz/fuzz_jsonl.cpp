// libFuzzer: one JSONL line through the record parser. A record is either rejected with a reason or valid
// by the rules the pipeline relies on (valid UTF-8, non-empty text or output, a chat with an assistant turn).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "data/records.h"
#include "data/utf8.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string line(reinterpret_cast<const char*>(data), size);
    const anvil::RawRecord r = anvil::parse_jsonl_line(line, "fuzz.jsonl", 1, "text");
    if (!r.reject.empty()) {
        if (r.reject_kind.empty()) std::abort();
        return 0;
    }
    if (r.example && r.ex.chat()) {
        if (!anvil::chat_problem(r.ex.messages).empty()) std::abort();
        for (const auto& m : r.ex.messages)
            if (!anvil::utf8::valid(m.content)) std::abort();
    } else if (r.example) {
        if (r.ex.output.empty() || !anvil::utf8::valid(r.ex.output) || !anvil::utf8::valid(r.ex.input) ||
            !anvil::utf8::valid(r.ex.instruction))
            std::abort();
    } else if (r.text.empty() || !anvil::utf8::valid(r.text)) {
        std::abort();
    }
    return 0;
}
