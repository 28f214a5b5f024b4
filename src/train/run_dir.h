// Guards for a run directory: one process writes it (rank 0 of a multi-process job), and what a crashed
// checkpoint save left behind is cleaned up.
#pragma once

#include <string>

namespace anvil {

// An exclusive lock on a run directory, held while the object lives: `DIR/anvil.lock`, locked with flock
// (released by the kernel when the process dies, even by kill -9) and holding the owner's pid, host and
// start time for the message another process gets.
class RunDirLock {
public:
    RunDirLock() = default;
    // Throws, naming the owner, if another process holds the directory. `flag` names it in messages.
    RunDirLock(const std::string& dir, const std::string& flag);
    RunDirLock(RunDirLock&& o) noexcept;
    RunDirLock& operator=(RunDirLock&& o) noexcept;
    RunDirLock(const RunDirLock&) = delete;
    RunDirLock& operator=(const RunDirLock&) = delete;
    ~RunDirLock();

private:
    void release();
    int fd_ = -1;
    std::string path_;
};

// Removes what an interrupted atomic write left in `dir` (the caller holds its lock, so no writer is alive):
// `NAME.tmp.PID` files and directories (a checkpoint being written), and `NAME.old.PID` directories (the
// previous version moved aside), which are put back when NAME itself is missing. Returns a one-line summary
// of what it did ("" when there was nothing).
std::string clean_stale_temporaries(const std::string& dir);

}  // namespace anvil
