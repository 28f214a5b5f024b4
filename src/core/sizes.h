// Sizes as users write them on the command line.
#pragma once

#include <cstdint>
#include <string>

namespace anvil {

// "2G", "512M", "1.5GiB", "1000000" -> bytes; `flag` names the option in errors. A size of 0 is an error
// unless `zero_ok` (a flag whose 0 turns something off).
uint64_t parse_bytes(const std::string& s, const char* flag, bool zero_ok = false);
// "10B", "300M", "2.5T", "1e9", "500000" -> a count (K, M, B or G, T: powers of 1000); it must be at least 1.
uint64_t parse_count(const std::string& s, const char* flag);

}  // namespace anvil
