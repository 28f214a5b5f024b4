#include "train/data_parallel.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace anvil {

DataParallel::DataParallel(Comm& comm, ParamStore& store) : comm_(comm) {
    if (comm.size() == 1) return;  // nothing to reduce
    ANVIL_CHECK(
        store.backend().device() == Device::CPU,
        "data parallelism on {} needs NCCL, which anvil does not drive yet; run the ranks with --device "
        "cpu, or one process per job on the GPU",
        device_name(store.backend().device()));
    int layers = 0;
    for (size_t i : store.trainable()) layers = std::max(layers, store.spec(i).layer + 1);
    buckets_.resize(size_t(layers) + 1);
    for (int l = -1; l < layers; l++)
        bucket(l).what = l < 0 ? "the gradient all-reduce of the embeddings, final norm and head"
                               : "the gradient all-reduce of layer " + std::to_string(l);
    // Runs of consecutive trainable entries of one layer are one span of the gradient arena (the padding
    // between entries is zero and stays zero when summed).
    const std::vector<size_t>& tr = store.trainable();
    for (size_t k = 0; k < tr.size();) {
        const int layer = store.spec(tr[k]).layer;
        size_t e = k + 1;
        while (e < tr.size() && store.spec(tr[e]).layer == layer) e++;
        const Tensor first = store.grad(tr[k]), last = store.grad(tr[e - 1]);
        ANVIL_CHECK(first.dtype == DType::F32 && last.dtype == DType::F32,
                    "data parallelism over MPI reduces f32 gradients; train with --precision fp32");
        float* begin = static_cast<float*>(first.data);
        const float* end = static_cast<const float*>(last.data) + last.numel();
        bucket(layer).spans.push_back({begin, size_t(end - begin)});
        bytes_ += size_t(end - begin) * sizeof(float);
        k = e;
    }
}

int64_t DataParallel::total(int64_t mine, const char* what) {
    double v = double(mine);  // exact for any count below 2^53
    comm_.allreduce_sum(&v, 1, what);
    return int64_t(v);
}

double DataParallel::total(double mine, const char* what) {
    comm_.allreduce_sum(&mine, 1, what);
    return mine;
}

void DataParallel::on_layer_grads_ready(int layer) {
    if (!armed_ || buckets_.empty()) return;
    for (const Span& s : bucket(layer).spans)
        pending_.push_back(comm_.allreduce_sum_start(s.data, s.n, bucket(layer).what.c_str()));
    comm_.progress();
}

void DataParallel::finish() {
    const auto t0 = std::chrono::steady_clock::now();
    for (const Comm::Pending& p : pending_) comm_.wait(p);
    pending_.clear();
    armed_ = false;
    exposed_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace anvil
