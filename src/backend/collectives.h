// Collectives on device memory among the ranks of a job: NCCL on the CUDA backend, for data parallelism's
// gradient all-reduce. The job itself (ranks, the host-side broadcast that shares NCCL's bootstrap id, the
// deadline, how to end the job) comes from the caller, so the backend layer needs no MPI.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace anvil {

struct CollectiveSetup {
    int rank = 0, size = 1;
    double timeout_s = 600;  // every wait is bounded by it (--comm-timeout)
    // Rank 0's `bytes` at `data` into every rank's `data` (over the host's MPI).
    std::function<void(void* data, size_t bytes)> broadcast_from_rank0;
    // Ends the whole job with this error (Comm::abort); must not return.
    std::function<void(const std::string& why)> abort;
};

class DeviceCollectives {
public:
    virtual ~DeviceCollectives() = default;
    virtual std::string describe() const = 0;  // "NCCL 2.27.3"
    // An in-place sum over the ranks of `t` (f32, bf16 or f16), started after the work the backend has
    // queued so far and run beside later work (its own stream); `what` names it in errors.
    virtual void allreduce_sum_start(Tensor t, const char* what) = 0;
    // The sum over the ranks of `t` into rank `root`'s (the others' are left as they were), started the same
    // way: ZeRO-1 sums each piece of the gradients on the rank that owns it.
    virtual void reduce_sum_start(Tensor t, int root, const char* what) = 0;
    // `flat` is one block per rank, rank r's of counts[r] elements, one after another: every block gets the
    // values its rank holds in it (ZeRO-1's weight all-gather). Started the same way.
    virtual void allgather_blocks_start(Tensor flat, const std::vector<size_t>& counts, const char* what) = 0;
    // Work queued on the backend from now on waits, on the device, for every collective started so far (it
    // sees the sums); the host does not wait and goes on queueing. A watchdog ends the job through
    // CollectiveSetup::abort, naming the collective, if one is not complete within the deadline or the
    // transport reports an error, wherever the host is then.
    virtual void wait_all_on_device() = 0;
    // The same, and the host waits too, until every started collective is complete (the time it spends is
    // communication the work before did not hide).
    virtual void wait_all() = 0;
};

}  // namespace anvil
