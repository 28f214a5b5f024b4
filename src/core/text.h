// Small string helpers the layers share: whitespace trimming and ASCII lowercasing.
#pragma once

#include <string>
#include <string_view>

namespace anvil {

// `s` without leading and trailing spaces, tabs, carriage returns and newlines.
inline std::string trim(std::string_view s) {
    const size_t a = s.find_first_not_of(" \t\r\n");
    if (a == std::string_view::npos) return {};
    return std::string(s.substr(a, s.find_last_not_of(" \t\r\n") - a + 1));
}

// `s` with ASCII A-Z lowercased (other bytes as they are).
inline std::string ascii_lower(std::string_view s) {
    std::string out(s);
    for (char& c : out)
        if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
    return out;
}

}  // namespace anvil
