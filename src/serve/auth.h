// API keys for `anvil serve` (--api-key, --api-key-file, $ANVIL_API_KEY), as OpenAI's API and vLLM take them:
// a request carries `Authorization: Bearer KEY`; without one of the server's keys it gets 401 in OpenAI's
// error shape. Keys are compared in time that does not depend on where they differ.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace anvil::serve {

class ApiKeys {
public:
    ApiKeys() = default;  // none: every request is let in
    explicit ApiKeys(std::vector<std::string> keys);
    bool on() const { return !keys_.empty(); }
    size_t size() const { return keys_.size(); }
    // Whether an Authorization header's value is "Bearer KEY" with one of the keys. Every key is compared
    // whole, whatever matched before.
    bool admits(std::string_view authorization) const;

private:
    std::vector<std::string> keys_;
};

// The keys of every --api-key, of --api-key-file (one a line; blank lines and lines starting with # are
// skipped) and of the environment's ANVIL_API_KEY (`env`, null when unset; several separated by commas).
// Errors name the flag: an empty key, a key with spaces or control characters, a file that cannot be read
// or holds no key.
ApiKeys load_api_keys(const std::vector<std::string>& flags, const std::string& file, const char* env);

}  // namespace anvil::serve
