#include "io/process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "core/error.h"

extern char** environ;

namespace anvil {

std::string ProcessResult::describe() const {
    if (signal) return fmt::format("killed by signal {} ({})", signal, strsignal(signal));
    return fmt::format("exit status {}", exit_code);
}

ProcessResult run_with_input(const std::string& command, std::string_view input) {
    int in[2];
    ANVIL_CHECK(::pipe2(in, O_CLOEXEC) == 0, "cannot create a pipe for `{}`: {}", command,
                std::strerror(errno));
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], STDIN_FILENO);
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    const char* argv[] = {"sh", "-c", command.c_str(), nullptr};
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, "/bin/sh", &fa, nullptr, const_cast<char* const*>(argv), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(in[0]);
    if (rc != 0) {
        ::close(in[1]);
        fail("cannot start `{}` (/bin/sh -c): {}", command, std::strerror(rc));
    }
    // A program that stops reading early is its business: its status decides, not the broken pipe. SIGPIPE is
    // blocked for this thread while writing (the write fails with EPIPE instead) and a pending one dropped.
    sigset_t pipe_sig, old;
    sigemptyset(&pipe_sig);
    sigaddset(&pipe_sig, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_sig, &old);
    for (size_t at = 0; at < input.size();) {
        const ssize_t n = ::write(in[1], input.data() + at, input.size() - at);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            if (errno == EPIPE) {
                const timespec zero{};
                sigtimedwait(&pipe_sig, nullptr, &zero);
            }
            break;
        }
        at += size_t(n);
    }
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    ::close(in[1]);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0)
        ANVIL_CHECK(errno == EINTR, "waiting for `{}`: {}", command, std::strerror(errno));
    ProcessResult r;
    if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
    return r;
}

}  // namespace anvil
