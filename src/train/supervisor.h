// anvil train --max-restarts N, torchrun's meaning: this process supervises, a child process (the worker)
// trains. When the worker dies (a crash, the kernel's out-of-memory killer, kill -9) or fails, it is started
// again after a back-off (1, 2, 4, ... seconds, at most 60) with --resume auto, so it continues from the
// newest undamaged checkpoint in the run directory (runtime/checkpoint.h), up to N times. A worker that
// finishes (exit 0), was stopped on purpose (130: Ctrl-C, SIGTERM, Slurm's USR1, each passed on to it once)
// or rejected its command line (2) is not restarted. Each restart is a line on stderr and a record in the
// run's metrics.jsonl ({"event": "restart", ...}); summary.json gets the count and the reasons. A worker
// whose supervisor dies gets SIGTERM: it saves a checkpoint and exits.
#pragma once

#include <string>
#include <vector>

namespace anvil {

struct Supervision {
    std::vector<std::string> first;  // the worker's arguments after the program name, its first start
    std::vector<std::string> again;  // and a restart's (--resume auto --out DIR)
    std::string out;                 // the run directory
    int max_restarts = 0;
};

// Runs the worker to the end, restarting it as above; returns anvil's exit status.
int supervise(const Supervision& s);

// This process is a supervised worker (its supervisor set ANVIL_SUPERVISED): it does not supervise again, and
// it takes a stop signal that arrives twice within 2 s (the original and the supervisor's copy) as one.
bool supervised_worker();

// The arguments this process was started with, after the program name (/proc/self/cmdline).
std::vector<std::string> own_arguments();

}  // namespace anvil
