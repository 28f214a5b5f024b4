// Run and model directories: what a user's path names (a model directory, a run directory's final/ or newest
// checkpoint, a PEFT adapter), and the guards for a run directory: one process writes it (rank 0 of a
// multi-process job), and what a crashed checkpoint save left behind is cleaned up.
#pragma once

#include <string>
#include <vector>

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

// A model directory from a user path: the directory itself if it has config.json (or is an adapter), else a
// run directory's final/ or newest checkpoint. `flag` names the option in errors.
std::string resolve_model_dir(const std::string& path, const char* flag = "--model");
// A PEFT adapter directory (adapter_config.json, no config.json of its own).
bool is_adapter_dir(const std::string& dir);
// The checkpoint directory to resume from: DIR itself if it holds trainer_state.json, else the newest
// checkpoint-N or final inside it. `flag` names the option in errors.
std::string resolve_checkpoint(const std::string& dir, const char* flag = "--resume");
// The checkpoints of a run directory (final and checkpoint-N, not a save in progress), newest first: by the
// step trainer_state.json records, or, where it cannot be read, the N of the name. Empty when there is none.
std::vector<std::string> list_checkpoints(const std::string& run_dir);

}  // namespace anvil
