#include "train/data_parallel.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace anvil {

DataParallel::DataParallel(Comm& comm, ParamStore& store, const AdamW& opt)
    : comm_(comm), store_(store), opt_(opt), zero_(opt.sharded()) {
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
    if (!zero_ || tr.empty()) return;
    ANVIL_CHECK(opt.shard().world == comm.size(), "ZeRO-1: the optimizer is sharded {} ways over {} ranks",
                opt.shard().world, comm.size());
    const std::vector<Tensor> flat = store.grad_tensors();
    ANVIL_CHECK(flat.size() == 1 && size_t(flat[0].numel()) >= opt.layout_floats(),
                "ZeRO-1: the gradients are not laid out like the optimizer's state");
    flat_ = flat[0].f32();
    for (int r = 0; r < comm.size(); r++) counts_.push_back(opt.begin(r + 1) - opt.begin(r));
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
    if (!armed_ || buckets_.empty() || zero_) return;
    for (const Span& s : bucket(layer).spans)
        pending_.push_back(comm_.allreduce_sum_start(s.data, s.n, bucket(layer).what.c_str()));
    comm_.progress();
}

void DataParallel::finish() {
    const auto t0 = std::chrono::steady_clock::now();
    for (const Comm::Pending& p : pending_) comm_.wait(p);
    pending_.clear();
    if (zero_ && flat_) comm_.reduce_scatter_sum(flat_, counts_, "the gradient reduce-scatter (ZeRO-1)");
    armed_ = false;
    exposed_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace anvil

namespace anvil {

void DataParallel::global_norm_sq(Tensor out) {
    Backend& be = store_.backend();
    const std::vector<Tensor> grads = store_.grad_tensors();
    if (!zero_ || !flat_) return be.global_norm_sq(out, grads);
    Tensor mine = grads[0];  // this rank's range: the only summed part
    mine.data = flat_ + opt_.begin(rank());
    mine.shape = Shape{int64_t(counts_[size_t(rank())])};
    be.global_norm_sq(out, {mine});
    float part = 0.0f;
    be.download(&part, out);
    const float all = float(total(double(part), "the gradient norm's sum (ZeRO-1)"));
    be.upload(out, &all);
}

void DataParallel::after_update() {
    if (!zero_ || !flat_) return;
    Backend& be = store_.backend();
    for (const AdamW::Piece& p : opt_.pieces()) be.download(flat_ + p.first, p.param);
    comm_.allgather_blocks(flat_, counts_, "the weight all-gather (ZeRO-1)");
    for (size_t i : store_.trainable()) be.upload(store_.param(i), flat_ + opt_.offset(i));
}

}  // namespace anvil
