// The job a process belongs to: its rank among the job's processes, its rank on this machine (which GPU it
// drives), and the collectives data parallelism needs. Every collective has a deadline: a rank that dies or
// stalls makes each live rank stop with an error naming itself, the collective and the deadline, and end the
// whole job, instead of hanging.
//
// One process (no launcher): a Comm of size 1 whose collectives return at once. Launched as several
// (mpirun, srun): Open MPI, loaded at run time from the plugin libanvil_mpi.so, so a one-process anvil needs
// no MPI installed.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace anvil {

class Comm {
public:
    virtual ~Comm() = default;
    int rank() const { return rank_; }
    int size() const { return size_; }
    int local_rank() const { return local_rank_; }
    double timeout() const { return timeout_s_; }
    virtual const char* kind() const = 0;  // "single" or "mpi"

    // A started collective; wait() completes it. `what` names it in errors ("all-reduce of layer 3").
    struct Pending {
        int id = -1;
    };
    // In-place sum over the ranks, started now and completed by wait() (overlaps with work in between).
    virtual Pending allreduce_sum_start(float* data, size_t n, const char* what) = 0;
    virtual void wait(Pending p) = 0;
    // Lets started collectives advance without waiting for them (MPI moves a message on only inside its
    // calls): the backward calls it between layers.
    virtual void progress() {}
    void allreduce_sum(float* data, size_t n, const char* what) { wait(allreduce_sum_start(data, n, what)); }
    virtual void allreduce_sum(double* data, size_t n, const char* what) = 0;
    // The sum over the ranks of their `data` into rank `root`'s (the others' are left as they were), started
    // now and completed by wait(): ZeRO-1 sums each piece of the gradients on the rank that owns it.
    virtual Pending reduce_sum_start(float* data, size_t n, int root, const char* what) = 0;
    // `data` is size() blocks, rank r's of counts[r] floats, one after another: every block gets the values
    // its rank holds in it.
    virtual void allgather_blocks(float* data, const std::vector<size_t>& counts, const char* what) = 0;
    // `all` receives size() blocks of `bytes`, rank r's at r * bytes.
    virtual void allgather(const void* mine, size_t bytes, void* all, const char* what) = 0;
    virtual void broadcast(void* data, size_t bytes, int root, const char* what) = 0;
    virtual void barrier(const char* what) = 0;
    // The ranks that pass the same `color`, as a Comm of their own ordered by `key` (tensor and data
    // parallelism's groups). Every rank of this Comm must call it. Keeps this Comm's deadline and local rank.
    virtual std::unique_ptr<Comm> split(int color, int key) = 0;
    // Prints "anvil: rank R: error: WHY" and ends every process of the job with status 1.
    [[noreturn]] virtual void abort(const std::string& why) = 0;

    // Ranks other than 0 keep quiet: their stdout and stderr go to /dev/null, except the errors abort()
    // prints, which still reach the terminal. No-op on rank 0.
    void quiet_unless_rank0();

protected:
    // Puts stderr back where it was before quiet_unless_rank0() (abort() calls it before printing).
    void restore_stderr() {
        if (saved_stderr_ < 0) return;
        std::fflush(stderr);
        ::dup2(saved_stderr_, 2);
    }
    int rank_ = 0, size_ = 1, local_rank_ = 0;
    double timeout_s_ = 600.0;
    int saved_stderr_ = -1;
};

// The launcher's view from the environment: the world size (1 without a launcher; `source` gets the variable
// that said so, e.g. "OMPI_COMM_WORLD_SIZE=2"). The local rank comes from MPI itself (the ranks sharing a
// node).
int launched_world_size(std::string* source = nullptr);
// This process's rank as the launcher set it (0 without one): for messages before MPI is up.
int launched_rank();

// This process's Comm: size 1 without a launcher, else the MPI plugin. `timeout_s` bounds every collective
// (--comm-timeout). Throws naming what to install when a launcher started several processes and the plugin or
// MPI cannot be loaded.
std::unique_ptr<Comm> make_comm(double timeout_s);

// Every rank must pass the same `value` (a hash of the options, a data fingerprint): returns normally when
// they do; otherwise throws, on every rank, naming `what` and the first rank whose value differs from rank
// 0's.
void check_same(Comm& c, uint64_t value, const std::string& what);

// Every rank's `mine` (any length), in rank order, on every rank.
std::vector<std::string> allgather_text(Comm& c, const std::string& mine, const char* what);

}  // namespace anvil
