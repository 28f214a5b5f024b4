// The MPI plugin (libanvil_mpi.so): Comm on Open MPI, loaded by make_comm() only when a launcher started
// several processes. Collectives are MPI's non-blocking ones, completed by polling MPI_Test against the
// deadline, so a dead or stopped rank turns into an error naming this rank and the collective, then MPI_Abort
// ends the job.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "dist/comm.h"

namespace anvil {
namespace {

constexpr double kBusyPollS = 0.05;  // how long a wait polls without sleeping

class MpiComm final : public Comm {
public:
    explicit MpiComm(double timeout_s) {
        int inited = 0;
        MPI_Initialized(&inited);
        if (!inited) {
            int provided = 0;
            MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
        }
        MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
        MPI_Comm_size(MPI_COMM_WORLD, &size_);
        MPI_Comm local;  // the ranks sharing this machine, for the local rank when the launcher sets none
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local);
        MPI_Comm_rank(local, &local_rank_);
        MPI_Comm_free(&local);
        timeout_s_ = timeout_s;
    }
    // A group of the job's ranks (split): shares the process's MPI, frees only its communicator.
    MpiComm(MPI_Comm group, int local_rank, double timeout_s) : comm_(group), world_(false) {
        MPI_Comm_rank(group, &rank_);
        MPI_Comm_size(group, &size_);
        local_rank_ = local_rank;
        timeout_s_ = timeout_s;
    }
    ~MpiComm() override {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (finalized) return;
        if (!world_)
            MPI_Comm_free(&comm_);
        else
            MPI_Finalize();
    }
    std::unique_ptr<Comm> split(int color, int key) override {
        MPI_Comm group;
        MPI_Comm_split(comm_, color, key, &group);
        auto c = std::make_unique<MpiComm>(group, local_rank_, timeout_s_);
        c->saved_stderr_ = saved_stderr_;  // a quiet rank's errors still reach the terminal
        return c;
    }
    const char* kind() const override { return "mpi"; }

    Pending allreduce_sum_start(float* data, size_t n, const char* what) override {
        MPI_Request req;
        MPI_Iallreduce(MPI_IN_PLACE, data, count(n, what), MPI_FLOAT, MPI_SUM, comm_, &req);
        return track(req, what);
    }
    void wait(Pending p) override {
        if (p.id < 0) return;
        Open& o = open_[size_t(p.id)];
        const auto t0 = std::chrono::steady_clock::now();
        for (;;) {
            int done = 0;
            MPI_Test(&o.req, &done, MPI_STATUS_IGNORE);
            if (done) break;
            const double waited =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            if (waited > timeout_s_)
                abort(o.what + " did not complete within " + std::to_string(int(timeout_s_)) +
                      " s (--comm-timeout): another rank has died, stalled or is not taking part");
            // Busy-poll at first: a non-blocking collective of libnbc advances one round per MPI call on each
            // rank, so napping between polls adds a nap per round (measured: ZeRO-1's reduces waited 159 ms a
            // step instead of 12). A long wait (another rank writing a checkpoint) then stops burning a core.
            if (waited > kBusyPollS) std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
        o.req = MPI_REQUEST_NULL;
        o.what.clear();
        o.busy = false;
    }
    using Comm::allreduce_sum;
    void allreduce_sum(double* data, size_t n, const char* what) override {
        MPI_Request req;
        MPI_Iallreduce(MPI_IN_PLACE, data, count(n, what), MPI_DOUBLE, MPI_SUM, comm_, &req);
        wait(track(req, what));
    }
    Pending reduce_sum_start(float* data, size_t n, int root, const char* what) override {
        MPI_Request req;
        const bool mine = rank_ == root;  // the root sums into its own data; the others only send
        MPI_Ireduce(mine ? MPI_IN_PLACE : data, mine ? data : nullptr, count(n, what), MPI_FLOAT, MPI_SUM,
                    root, comm_, &req);
        return track(req, what);
    }
    void allgather_blocks(float* data, const std::vector<size_t>& counts, const char* what) override {
        const Blocks b = blocks(counts, what);
        MPI_Request req;
        MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, b.counts.data(), b.displs.data(), MPI_FLOAT,
                        comm_, &req);
        wait(track(req, what));
    }
    void allgather(const void* mine, size_t bytes, void* all, const char* what) override {
        MPI_Request req;
        MPI_Iallgather(mine, count(bytes, what), MPI_BYTE, all, count(bytes, what), MPI_BYTE, comm_, &req);
        wait(track(req, what));
    }
    void broadcast(void* data, size_t bytes, int root, const char* what) override {
        MPI_Request req;
        MPI_Ibcast(data, count(bytes, what), MPI_BYTE, root, comm_, &req);
        wait(track(req, what));
    }
    void barrier(const char* what) override {
        MPI_Request req;
        MPI_Ibarrier(comm_, &req);
        wait(track(req, what));
    }
    void progress() override {
        for (Open& o : open_)
            if (o.req != MPI_REQUEST_NULL) {
                int done = 0;
                MPI_Test(&o.req, &done, MPI_STATUS_IGNORE);  // a completed request becomes MPI_REQUEST_NULL
            }
    }
    [[noreturn]] void abort(const std::string& why) override {
        restore_stderr();
        int world_rank = rank_;  // a group's errors name the job's rank
        MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
        std::fprintf(stderr, "anvil: rank %d: error: %s\n", world_rank, why.c_str());
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 1);
        std::_Exit(1);
    }

private:
    struct Open {
        MPI_Request req = MPI_REQUEST_NULL;  // MPI_REQUEST_NULL once complete (progress() may complete it)
        std::string what;
        bool busy = false;  // until wait(): the Pending handed out still names this slot
    };
    std::vector<Open> open_;
    MPI_Comm comm_ = MPI_COMM_WORLD;
    bool world_ = true;  // the job's communicator: MPI_Finalize when done

    struct Blocks {
        std::vector<int> counts, displs;
    };
    Blocks blocks(const std::vector<size_t>& counts, const char* what) {
        Blocks b;
        size_t at = 0;
        for (size_t c : counts) {
            b.counts.push_back(count(c, what));
            b.displs.push_back(count(at, what));
            at += c;
        }
        return b;
    }
    int count(size_t n, const char* what) {
        if (n > size_t(1) << 31) abort(std::string(what) + ": more than 2^31 elements in one collective");
        return int(n);
    }
    Pending track(MPI_Request req, const char* what) {
        size_t i = 0;
        while (i < open_.size() && open_[i].busy) i++;
        if (i == open_.size()) open_.emplace_back();
        open_[i] = {req, what, true};
        return {int(i)};
    }
};

}  // namespace
}  // namespace anvil

extern "C" anvil::Comm* anvil_mpi_comm_create(double timeout_s) {
    return new anvil::MpiComm(timeout_s);
}
