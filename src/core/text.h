// Small string helpers the layers share: whitespace trimming, ASCII lowercasing, and the environment's lever
// switches.
#pragma once

#include <cstdlib>
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

// A lever measured against the path before it: on unless the environment sets `name` to "0"
// (ANVIL_GELU_EPILOGUE, ANVIL_CUDA_GRAPHS, ANVIL_FUSE_PROJECTIONS).
inline bool env_not_off(const char* name) {
    const char* v = std::getenv(name);
    return !(v && std::string_view(v) == "0");
}

// An opt-in: on only where the environment sets `name` to "1" (ANVIL_CUDNN_NONDETERMINISTIC).
inline bool env_on(const char* name) {
    const char* v = std::getenv(name);
    return v && std::string_view(v) == "1";
}

}  // namespace anvil
