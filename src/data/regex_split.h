// A tokenizer.json `Split` pre-tokenizer with behavior "Isolated": every match of the pattern is a piece, and
// so is every run of text between matches; and whether a text contains a match (pseudo-label's --verify
// regex:). Patterns are PCRE2 with Unicode properties (\p{L}, \p{N}) and Unicode \s, compiled once and
// JIT-compiled where the platform allows.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace anvil {

class RegexSplit {
public:
    // `what` names the pattern for errors ("FILE: the Split pattern"; an invalid one says where it failed).
    RegexSplit(const std::string& pattern, const std::string& what);
    ~RegexSplit();
    RegexSplit(const RegexSplit&) = delete;
    RegexSplit& operator=(const RegexSplit&) = delete;
    // Appends the end offset (bytes) of each piece of `text` (valid UTF-8).
    void split(std::string_view text, std::vector<uint32_t>& ends) const;
    // Whether `text` contains a match (false for text that is not valid UTF-8).
    bool search(std::string_view text) const;
    const std::string& pattern() const { return pattern_; }

private:
    std::string pattern_;
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace anvil
