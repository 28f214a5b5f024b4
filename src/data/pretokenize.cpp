#include "data/pretokenize.h"

#include <unicode/uchar.h>

#include <array>
#include <map>
#include <memory>

#include "data/utf8.h"

namespace anvil {

namespace {

// Two-stage table over all code points (256-entry blocks, identical blocks shared), built once from ICU.
struct ClassTable {
    std::vector<uint16_t> block;  // code point >> 8 -> block index
    std::vector<uint8_t> cls;     // block index * 256 + (cp & 255) -> CharClass

    ClassTable() {
        std::map<std::array<uint8_t, 256>, uint16_t> seen;
        block.resize(0x110000 >> 8);
        for (uint32_t b = 0; b < block.size(); b++) {
            std::array<uint8_t, 256> c{};
            for (uint32_t k = 0; k < 256; k++) c[k] = compute((b << 8) | k);
            auto [it, added] = seen.emplace(c, uint16_t(seen.size()));
            if (added) cls.insert(cls.end(), c.begin(), c.end());
            block[b] = it->second;
        }
    }
    static uint8_t compute(uint32_t cp) {
        const UChar32 c = UChar32(cp);
        if (u_hasBinaryProperty(c, UCHAR_WHITE_SPACE)) return kClassSpace;
        switch (u_charType(c)) {
            case U_UPPERCASE_LETTER:
            case U_LOWERCASE_LETTER:
            case U_TITLECASE_LETTER:
            case U_MODIFIER_LETTER:
            case U_OTHER_LETTER:
                return kClassLetter;
            case U_DECIMAL_DIGIT_NUMBER:
            case U_LETTER_NUMBER:
            case U_OTHER_NUMBER:
                return kClassNumber;
            default:
                return kClassOther;
        }
    }
    CharClass get(uint32_t cp) const {
        if (cp >= 0x110000) return kClassOther;
        return CharClass(cls[size_t(block[cp >> 8]) * 256 + (cp & 255)]);
    }
};

const ClassTable& table() {
    static const ClassTable t;
    return t;
}

// ASCII classes without a table lookup.
constexpr std::array<uint8_t, 128> kAscii = [] {
    std::array<uint8_t, 128> a{};
    for (int c = 0; c < 128; c++) {
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
            a[size_t(c)] = kClassLetter;
        else if (c >= '0' && c <= '9')
            a[size_t(c)] = kClassNumber;
        else if ((c >= 9 && c <= 13) || c == ' ')
            a[size_t(c)] = kClassSpace;
        else
            a[size_t(c)] = kClassOther;
    }
    return a;
}();

struct Cursor {
    std::string_view s;
    const ClassTable& t;
    // class and byte length of the code point at i
    CharClass at(size_t i, int* len) const {
        const uint8_t c = uint8_t(s[i]);
        if (c < 0x80) {
            *len = 1;
            return CharClass(kAscii[c]);
        }
        uint32_t cp = 0xfffd;
        *len = utf8::decode(s, i, &cp);
        if (*len == 0) *len = 1;  // callers pass valid UTF-8; never loop forever if not
        return t.get(cp);
    }
    // end of the run of `cls` code points starting at i
    size_t run(size_t i, CharClass cls) const {
        int len;
        while (i < s.size() && at(i, &len) == cls) i += size_t(len);
        return i;
    }
};

}  // namespace

CharClass char_class(uint32_t cp) {
    return cp < 128 ? CharClass(kAscii[cp]) : table().get(cp);
}

void gpt2_pretokenize(std::string_view text, std::vector<uint32_t>& ends) {
    const Cursor cur{text, table()};
    const size_t n = text.size();
    size_t i = 0;
    while (i < n) {
        // 's|'t|'re|'ve|'m|'ll|'d
        if (text[i] == '\'' && i + 1 < n) {
            const char a = text[i + 1], b = i + 2 < n ? text[i + 2] : '\0';
            size_t len = 0;
            if (a == 's' || a == 't' || a == 'm' || a == 'd')
                len = 2;
            else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
                len = 3;
            if (len) {
                i += len;
                ends.push_back(uint32_t(i));
                continue;
            }
        }
        //  ?\p{L}+ |  ?\p{N}+ |  ?[^\s\p{L}\p{N}]+
        const size_t s = text[i] == ' ' && i + 1 < n ? i + 1 : i;
        int len;
        const CharClass c = cur.at(s, &len);
        if (c != kClassSpace) {
            i = cur.run(s, c);
            ends.push_back(uint32_t(i));
            continue;
        }
        // \s+(?!\S) | \s+  (c is a space here, and so is text[i])
        size_t j = i, last = i;
        while (j < n) {
            int l;
            if (cur.at(j, &l) != kClassSpace) break;
            last = j;
            j += size_t(l);
        }
        if (j < n && last > i) j = last;  // followed by a non-space: leave the last space for the next piece
        i = j;
        ends.push_back(uint32_t(i));
    }
}

}  // namespace anvil
