// UTF-8: validation, decoding one code point, and repair of invalid input. Invalid sequences are replaced
// by U+FFFD one "maximal subpart" at a time (the Unicode/WHATWG practice that Python's errors="replace" and
// JavaScript's TextDecoder follow), so a repaired string is what those decoders would have produced.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace anvil::utf8 {

// Decodes the code point at s[i]; returns its length in bytes, or 0 if the bytes there are not a valid
// UTF-8 sequence. `cp` receives the code point.
inline int decode(std::string_view s, size_t i, uint32_t* cp) {
    const auto b = [&](size_t k) { return uint8_t(s[k]); };
    const uint8_t c = b(i);
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    const size_t n = s.size();
    if (c >= 0xc2 && c <= 0xdf) {
        if (i + 1 < n && (b(i + 1) & 0xc0) == 0x80) {
            *cp = uint32_t(c & 0x1f) << 6 | (b(i + 1) & 0x3f);
            return 2;
        }
        return 0;
    }
    if (c >= 0xe0 && c <= 0xef) {
        if (i + 2 >= n) return 0;
        const uint8_t c1 = b(i + 1), c2 = b(i + 2);
        const uint8_t lo = c == 0xe0 ? 0xa0 : 0x80,
                      hi = c == 0xed ? 0x9f : 0xbf;  // no overlongs, no surrogates
        if (c1 < lo || c1 > hi || (c2 & 0xc0) != 0x80) return 0;
        *cp = uint32_t(c & 0x0f) << 12 | uint32_t(c1 & 0x3f) << 6 | (c2 & 0x3f);
        return 3;
    }
    if (c >= 0xf0 && c <= 0xf4) {
        if (i + 3 >= n) return 0;
        const uint8_t c1 = b(i + 1), c2 = b(i + 2), c3 = b(i + 3);
        const uint8_t lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
        if (c1 < lo || c1 > hi || (c2 & 0xc0) != 0x80 || (c3 & 0xc0) != 0x80) return 0;
        *cp = uint32_t(c & 0x07) << 18 | uint32_t(c1 & 0x3f) << 12 | uint32_t(c2 & 0x3f) << 6 | (c3 & 0x3f);
        return 4;
    }
    return 0;
}

bool valid(std::string_view s);
// Offset of the first byte that does not start a valid sequence, or std::string_view::npos.
size_t first_invalid(std::string_view s);
// Invalid sequences replaced by U+FFFD (one per maximal subpart).
std::string repair(std::string_view s);
void append(std::string& out, uint32_t cp);
// Bytes at the end of s that begin a character not yet complete (text decoded a token at a time): 0 to 3.
size_t incomplete_tail(std::string_view s);

// Unicode normalization forms (a tokenizer.json's NFC, NFD, NFKC and NFKD normalizers), through ICU.
enum class Form : uint8_t { None, NFC, NFD, NFKC, NFKD };
// "NFC" -> Form::NFC ...; Form::None for any other name.
Form form_from_name(std::string_view name);
// `s` (valid UTF-8) in form `f`: `s` itself when it already is (ASCII always is), else the normalized text in
// `storage`.
std::string_view normalize(Form f, std::string_view s, std::string& storage);

}  // namespace anvil::utf8
