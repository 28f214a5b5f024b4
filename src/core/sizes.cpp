#include "core/sizes.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "core/error.h"

namespace anvil {

uint64_t parse_bytes(const std::string& s, const char* flag, bool zero_ok) {
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    ANVIL_CHECK(end != s.c_str() && (v > 0 || (zero_ok && v == 0)), "{} {}: give a size such as 2G or 512M{}",
                flag, s, zero_ok ? " (or 0)" : "");
    std::string unit(end);
    for (char& c : unit) c = char(std::toupper(static_cast<unsigned char>(c)));
    if (unit.ends_with("IB"))
        unit.resize(unit.size() - 2);
    else if (unit.ends_with("B"))
        unit.pop_back();
    double mult = 1;
    if (unit == "K")
        mult = 1024;
    else if (unit == "M")
        mult = 1024.0 * 1024;
    else if (unit == "G")
        mult = 1024.0 * 1024 * 1024;
    else if (unit == "T")
        mult = 1024.0 * 1024 * 1024 * 1024;
    else
        ANVIL_CHECK(unit.empty(), "{} {}: unknown unit \"{}\"; use K, M, G or T", flag, s, unit);
    return uint64_t(v * mult);
}

uint64_t parse_count(const std::string& s, const char* flag) {
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    std::string unit(end);
    for (char& c : unit) c = char(std::toupper(static_cast<unsigned char>(c)));
    double mult = 0;
    if (unit.empty())
        mult = 1;
    else if (unit == "K")
        mult = 1e3;
    else if (unit == "M")
        mult = 1e6;
    else if (unit == "B" || unit == "G")
        mult = 1e9;
    else if (unit == "T")
        mult = 1e12;
    ANVIL_CHECK(end != s.c_str() && mult > 0 && std::isfinite(v) && v * mult >= 1 && v * mult < 1e19,
                "{} {}: give a positive count such as 10B, 300M or 2.5T (K, M, B, T: thousands to trillions)",
                flag, s);
    return uint64_t(std::llround(v * mult));
}

}  // namespace anvil
