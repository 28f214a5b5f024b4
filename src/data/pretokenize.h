// GPT-2's pre-tokenizer: the pieces its regex
//     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// finds, alternatives tried in that order as a backtracking regex engine does. \s is the Unicode White_Space
// property (as in GPT-2's Python `regex` module; JavaScript's \s differs on U+0085 and U+FEFF), \p{L} and
// \p{N} the letter and number categories from ICU.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace anvil {

enum CharClass : uint8_t { kClassOther = 0, kClassLetter = 1, kClassNumber = 2, kClassSpace = 3 };
CharClass char_class(uint32_t cp);

// Appends the end offset (in bytes) of each piece of `text`, which must be valid UTF-8.
void gpt2_pretokenize(std::string_view text, std::vector<uint32_t>& ends);

}  // namespace anvil
