#include "serve/auth.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "core/text.h"
#include "io/fs.h"

namespace anvil::serve {

namespace {

// Equal strings, in time that depends on their lengths only.
bool same(std::string_view a, std::string_view b) {
    const size_t n = std::max(a.size(), b.size());
    volatile unsigned char diff = a.size() != b.size();
    for (size_t i = 0; i < n; i++) {
        const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
        const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
        diff = static_cast<unsigned char>(diff | (x ^ y));
    }
    return diff == 0;
}

void check_key(const std::string& key, const std::string& where) {
    ANVIL_CHECK(!key.empty(), "{}: an empty API key; give a non-empty one (e.g. from `openssl rand -hex 24`)",
                where);
    for (char c : key)
        ANVIL_CHECK(static_cast<unsigned char>(c) > 32 && c != 127,
                    "{}: an API key holds a space or a control character; a key is one printable word",
                    where);
}

}  // namespace

ApiKeys::ApiKeys(std::vector<std::string> keys) : keys_(std::move(keys)) {}

bool ApiKeys::admits(std::string_view authorization) const {
    constexpr std::string_view kBearer = "Bearer ";
    if (authorization.size() <= kBearer.size() || authorization.substr(0, kBearer.size()) != kBearer)
        return false;
    const std::string_view given = authorization.substr(kBearer.size());
    bool any = false;
    for (const std::string& k : keys_) any = same(given, k) | any;  // no early exit
    return any;
}

ApiKeys load_api_keys(const std::vector<std::string>& flags, const std::string& file, const char* env) {
    std::vector<std::string> keys;
    for (const std::string& k : flags) {
        check_key(k, "--api-key");
        keys.push_back(k);
    }
    if (!file.empty()) {
        ANVIL_CHECK(file_exists(file), "--api-key-file {}: no such file; give a file with one key a line",
                    file);
        size_t n = 0;
        read_lines(file, [&](const std::string& raw, size_t line) {
            const std::string k = trim(raw);
            if (k.empty() || k[0] == '#') return;
            check_key(k, fmt::format("--api-key-file {}, line {}", file, line));
            keys.push_back(k);
            n++;
        });
        ANVIL_CHECK(n > 0, "--api-key-file {}: holds no key (one a line; # starts a comment)", file);
    }
    if (env) {
        const std::string all = env;
        size_t n = 0;
        for (size_t i = 0; i <= all.size();) {
            const size_t j = std::min(all.find(',', i), all.size());
            const std::string k = trim(std::string_view(all).substr(i, j - i));
            if (!k.empty()) check_key(k, "ANVIL_API_KEY"), keys.push_back(k), n++;
            i = j + 1;
        }
        ANVIL_CHECK(n > 0,
                    "ANVIL_API_KEY is set but holds no key; unset it, or give keys separated by commas");
    }
    return ApiKeys(std::move(keys));
}

}  // namespace anvil::serve
