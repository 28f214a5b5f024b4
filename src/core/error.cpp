#include "core/error.h"

namespace anvil {

void check_fail(const char* expr, const char* func, const char* file, int line, const std::string& detail) {
    throw Error(fmt::format("{} failed: `{}` in {} at {}:{}", detail, expr, func, file, line));
}

void device_check_fail(const char* expr, const char* func, const char* file, int line,
                       const std::string& detail) {
    throw DeviceError(fmt::format("{} failed: `{}` in {} at {}:{}", detail, expr, func, file, line));
}

}  // namespace anvil
