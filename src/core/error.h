// Errors. Library code throws anvil::Error; only main() decides to exit.
//
// Two kinds of failure, one family of macros:
//   ANVIL_CHECK(cond, fmt, args...)  user-facing: the message names the file, flag or tensor and says what
//                                    to do. Thrown as-is, printed as one line by the CLI.
//   ANVIL_ASSERT(cond)               internal invariant: records expression, function, file and line.
// Backend libraries add their own checks built on anvil_check_fail (CUDA_CHECK, CUBLAS_CHECK, ... in
// src/backend/cuda/cuda_check.h) so every error carries the same information.
#pragma once

#include <stdexcept>
#include <string>

#ifdef __CUDACC__
#include <sstream>
#else
#include <fmt/format.h>
#endif

namespace anvil {

class Error : public std::runtime_error {
public:
    explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// What a user gave is wrong (ANVIL_CHECK, fail()): a flag, a file, a record. The message says what to do.
class InputError : public Error {
public:
    using Error::Error;
};

// The device or one of its libraries failed (CUDA_CHECK, CUBLAS_CHECK, device_check_fail).
class DeviceError : public Error {
public:
    using Error::Error;
};

// An allocation did not fit the device (or the limit set with --memory-limit). The batch-size search
// catches it; elsewhere it is an ordinary device error.
class OutOfMemory : public DeviceError {
public:
    using DeviceError::DeviceError;
};

// Generic form: every check macro ends here, with the failing expression and where it was.
[[noreturn]] void check_fail(const char* expr, const char* func, const char* file, int line,
                             const std::string& detail);
// The same for a device library's status (thrown as DeviceError).
[[noreturn]] void device_check_fail(const char* expr, const char* func, const char* file, int line,
                                    const std::string& detail);

#ifndef __CUDACC__
template <typename... Args>
[[noreturn]] inline void fail(fmt::format_string<Args...> f, Args&&... args) {
    throw InputError(fmt::format(f, std::forward<Args>(args)...));
}
#else
// nvcc cannot compile fmt 9's headers, so kernel files get the same call with plain `{}` fields
// filled in order (no format specs); their host code around the kernels stays this simple.
namespace detail {
inline void put_args(std::ostringstream& os, const char* f) {
    os << f;
}
template <typename A, typename... Rest>
void put_args(std::ostringstream& os, const char* f, const A& a, const Rest&... rest) {
    for (; *f; f++) {
        if (f[0] == '{' && f[1] == '}') {
            os << a;
            return put_args(os, f + 2, rest...);
        }
        os << *f;
    }
}
}  // namespace detail
template <typename... Args>
[[noreturn]] inline void fail(const char* f, const Args&... args) {
    std::ostringstream os;
    detail::put_args(os, f, args...);
    throw InputError(os.str());
}
#endif

}  // namespace anvil

#define ANVIL_CHECK(cond, ...)          \
    do {                                \
        if (!(cond)) [[unlikely]]       \
            ::anvil::fail(__VA_ARGS__); \
    } while (0)

#define ANVIL_ASSERT(cond)                                                                  \
    do {                                                                                    \
        if (!(cond)) [[unlikely]]                                                           \
            ::anvil::check_fail(#cond, __func__, __FILE__, __LINE__, "internal invariant"); \
    } while (0)
