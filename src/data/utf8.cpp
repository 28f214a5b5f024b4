#include "data/utf8.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>

#include <algorithm>

#include "core/error.h"

namespace anvil::utf8 {

size_t first_invalid(std::string_view s) {
    uint32_t cp;
    for (size_t i = 0; i < s.size();) {
        const int n = decode(s, i, &cp);
        if (n == 0) return i;
        i += size_t(n);
    }
    return std::string_view::npos;
}

size_t incomplete_tail(std::string_view s) {
    for (size_t back = 1; back <= std::min<size_t>(3, s.size()); back++) {
        const auto c = uint8_t(s[s.size() - back]);
        if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
        const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > back ? back : 0;
    }
    return 0;
}

bool valid(std::string_view s) {
    return first_invalid(s) == std::string_view::npos;
}

void append(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out.push_back(char(cp));
    } else if (cp < 0x800) {
        out.push_back(char(0xc0 | (cp >> 6)));
        out.push_back(char(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
        out.push_back(char(0xe0 | (cp >> 12)));
        out.push_back(char(0x80 | ((cp >> 6) & 0x3f)));
        out.push_back(char(0x80 | (cp & 0x3f)));
    } else {
        out.push_back(char(0xf0 | (cp >> 18)));
        out.push_back(char(0x80 | ((cp >> 12) & 0x3f)));
        out.push_back(char(0x80 | ((cp >> 6) & 0x3f)));
        out.push_back(char(0x80 | (cp & 0x3f)));
    }
}

// Length of the maximal subpart at s[i]: the longest prefix of a well-formed sequence (at least 1 byte).
static size_t maximal_subpart(std::string_view s, size_t i) {
    const uint8_t c = uint8_t(s[i]);
    size_t need;
    uint8_t lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf)
        need = 1;
    else if (c >= 0xe0 && c <= 0xef) {
        need = 2;
        if (c == 0xe0) lo = 0xa0;
        if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 3;
        if (c == 0xf0) lo = 0x90;
        if (c == 0xf4) hi = 0x8f;
    } else
        return 1;
    size_t k = 1;
    while (k <= need && i + k < s.size()) {
        const uint8_t x = uint8_t(s[i + k]);
        if (x < lo || x > hi) break;
        lo = 0x80;
        hi = 0xbf;
        k++;
    }
    return k;
}

std::string repair(std::string_view s) {
    std::string out;
    out.reserve(s.size() + 16);
    uint32_t cp;
    for (size_t i = 0; i < s.size();) {
        const int n = decode(s, i, &cp);
        if (n > 0) {
            out.append(s.substr(i, size_t(n)));
            i += size_t(n);
        } else {
            append(out, 0xfffd);
            i += maximal_subpart(s, i);
        }
    }
    return out;
}

Form form_from_name(std::string_view name) {
    if (name == "NFC") return Form::NFC;
    if (name == "NFD") return Form::NFD;
    if (name == "NFKC") return Form::NFKC;
    if (name == "NFKD") return Form::NFKD;
    return Form::None;
}

std::string_view normalize(Form f, std::string_view s, std::string& storage) {
    if (f == Form::None || std::all_of(s.begin(), s.end(), [](char c) { return uint8_t(c) < 0x80; }))
        return s;
    UErrorCode err = U_ZERO_ERROR;
    const icu::Normalizer2* n = f == Form::NFC    ? icu::Normalizer2::getNFCInstance(err)
                                : f == Form::NFD  ? icu::Normalizer2::getNFDInstance(err)
                                : f == Form::NFKC ? icu::Normalizer2::getNFKCInstance(err)
                                                  : icu::Normalizer2::getNFKDInstance(err);
    ANVIL_CHECK(U_SUCCESS(err), "ICU: no Unicode normalizer ({})", u_errorName(err));
    const icu::StringPiece in(s.data(), int32_t(s.size()));
    if (n->isNormalizedUTF8(in, err) && U_SUCCESS(err)) return s;
    err = U_ZERO_ERROR;
    storage.clear();
    icu::StringByteSink<std::string> sink(&storage);
    n->normalizeUTF8(0, in, sink, nullptr, err);
    ANVIL_CHECK(U_SUCCESS(err), "ICU: Unicode normalization failed ({})", u_errorName(err));
    return storage;
}

}  // namespace anvil::utf8
