// Running another program as a filter: a shell command fed one input on its standard input, its exit status
// read back (the answer checkers of `anvil data pseudo-label --verify cmd:...`).
#pragma once

#include <string>
#include <string_view>

namespace anvil {

struct ProcessResult {
    int exit_code = -1;  // the exit status, when the program exited
    int signal = 0;      // the signal that ended it, else 0
    bool exited() const { return signal == 0 && exit_code >= 0; }
    // what happened, for an error: "exit status 3", "killed by signal 11 (Segmentation fault)"
    std::string describe() const;
};

// Runs `command` with /bin/sh -c, `input` written to its standard input (then closed); its standard output is
// discarded, its standard error passes through. Waits for it. Throws only when the process cannot be started.
ProcessResult run_with_input(const std::string& command, std::string_view input);

}  // namespace anvil
