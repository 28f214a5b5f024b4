#include "train/data_parallel.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace anvil {

DataParallel::DataParallel(const ProcessGrid& grid, ParamStore& store, const AdamW& opt, bool even_alone)
    : world_(*grid.world), comm_(*grid.dp), tp_(grid.tp), store_(store), opt_(opt), zero_(opt.sharded()) {
    if (tp_) {  // the gradients the norm sums over the group, and those it counts once
        const auto add = [&](size_t entry, Tensor g) {
            (store.spec(entry).shard.split() ? split_grads_ : whole_grads_).push_back(g);
        };
        if (zero_)
            for (const AdamW::Piece& p : opt.pieces()) add(p.entry, p.grad);
        else
            for (size_t i : store.trainable()) add(i, store.grad(i));
    }
    if (comm_.size() == 1 && !even_alone) return;  // nothing to reduce
    Backend& be = store.backend();
    if (be.device() != Device::CPU) {  // device memory: the backend's collectives (NCCL)
        ANVIL_CHECK(!zero_, "--zero 1: ZeRO-1 runs on the CPU backend for now; drop the flag on {}",
                    device_name(be.device()));
        device_ = make_device_collectives(comm_, be, "data parallelism");
    }
    int layers = 0;
    for (size_t i : store.trainable()) layers = std::max(layers, store.spec(i).layer + 1);
    buckets_.resize(size_t(layers) + 1);
    for (int l = -1; l < layers; l++)
        bucket(l).what = l < 0 ? "the gradient all-reduce of the embeddings, final norm and head"
                               : "the gradient all-reduce of layer " + std::to_string(l);
    // Runs of consecutive trainable entries of one layer and dtype are one span of the gradient arena (the
    // padding between entries is zero and stays zero when summed).
    const std::vector<size_t>& tr = store.trainable();
    for (size_t k = 0; k < tr.size();) {
        const int layer = store.spec(tr[k]).layer;
        const DType dt = store.grad(tr[k]).dtype;
        size_t e = k + 1;
        while (e < tr.size() && store.spec(tr[e]).layer == layer && store.grad(tr[e]).dtype == dt) e++;
        ANVIL_CHECK(device_ || dt == DType::F32,
                    "data parallelism over MPI reduces f32 gradients; train with --precision fp32");
        const Tensor first = store.grad(tr[k]), last = store.grad(tr[e - 1]);
        const size_t bytes = size_t(static_cast<const char*>(last.data) + last.nbytes() -
                                    static_cast<const char*>(first.data));
        Tensor span = first;
        span.shape = Shape{int64_t(bytes / dtype_size(dt))};
        bucket(layer).spans.push_back(span);
        bytes_ += bytes;
        k = e;
    }
    if (!zero_ || tr.empty()) return;
    ANVIL_CHECK(opt.shard().world == comm_.size(), "ZeRO-1: the optimizer is sharded {} ways over {} ranks",
                opt.shard().world, comm_.size());
    const std::vector<Tensor> flat = store.grad_tensors();
    ANVIL_CHECK(flat.size() == 1 && size_t(flat[0].numel()) >= opt.layout_floats(),
                "ZeRO-1: the gradients are not laid out like the optimizer's state");
    flat_ = flat[0].range(0, opt.layout_floats());
    counts_ = opt.range_sizes();
}

int64_t DataParallel::total_targets(int64_t mine) {
    double v = double(mine);  // exact for any count below 2^53
    comm_.allreduce_sum(&v, 1, "the step's target count");
    return int64_t(v);
}

double DataParallel::total_loss(double mine) {
    // a tensor-parallel group's ranks share their rows' loss: its first rank counts it; every rank votes
    double v[2] = {tp_ && tp_->rank() != 0 ? 0.0 : mine, stop_vote_ ? 1.0 : 0.0};
    world_.allreduce_sum(v, 2, "the step's loss and stop vote");
    stop_agreed_ = v[1] > 0;
    return v[0];
}

void DataParallel::on_layer_grads_ready(int layer) {
    if (!armed_ || buckets_.empty() || zero_) return;
    for (const Tensor& s : bucket(layer).spans) {
        if (device_)
            device_->allreduce_sum_start(s, bucket(layer).what.c_str());
        else
            pending_.push_back(
                comm_.allreduce_sum_start(s.f32(), size_t(s.numel()), bucket(layer).what.c_str()));
    }
    comm_.progress();
}

void DataParallel::finish() {
    const auto t0 = std::chrono::steady_clock::now();
    for (const Comm::Pending& p : pending_) comm_.wait(p);
    pending_.clear();
    if (device_) device_->wait_all();
    if (!flat_.empty())
        comm_.reduce_scatter_sum(flat_.f32(), counts_, "the gradient reduce-scatter (ZeRO-1)");
    armed_ = false;
    exposed_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double DataParallel::norm_sq_of(Tensor scratch, const std::vector<Tensor>& grads) {
    if (grads.empty()) return 0.0;
    Backend& be = store_.backend();
    be.global_norm_sq(scratch, grads);
    float v = 0.0f;
    be.download(&v, scratch);
    return v;
}

void DataParallel::global_norm_sq(Tensor out) {
    Backend& be = store_.backend();
    if (tp_) {
        double v[2] = {norm_sq_of(out, split_grads_), norm_sq_of(out, whole_grads_)};
        if (zero_) comm_.allreduce_sum(v, 2, "the gradient norm's sum (ZeRO-1)");
        tp_->allreduce_sum(v, 1, "the gradient norm's sum over the tensor-parallel group");
        const float all = float(v[0] + v[1]);
        return be.upload(out, &all);
    }
    if (flat_.empty()) return be.global_norm_sq(out, store_.grad_tensors());
    // ZeRO-1: this rank's range is the only summed part
    be.global_norm_sq(out, {flat_.range(opt_.begin(rank()), counts_[size_t(rank())])});
    float part = 0.0f;
    be.download(&part, out);
    double all = part;
    comm_.allreduce_sum(&all, 1, "the gradient norm's sum (ZeRO-1)");
    const float all_f = float(all);
    be.upload(out, &all_f);
}

void DataParallel::after_update() {
    if (flat_.empty()) return;
    Backend& be = store_.backend();
    float* flat = flat_.f32();
    for (const AdamW::Piece& p : opt_.pieces()) be.download(flat + p.first, p.param);
    comm_.allgather_blocks(flat, counts_, "the weight all-gather (ZeRO-1)");
    for (size_t i : store_.trainable()) be.upload(store_.param(i), flat + opt_.offset(i));
}

void DataParallel::gather_moments(std::vector<float>& m_all, std::vector<float>& v_all) {
    for (auto [all, mine] : {std::pair{&m_all, opt_.m_range()}, std::pair{&v_all, opt_.v_range()}}) {
        all->assign(opt_.layout_floats(), 0.0f);
        store_.backend().download(all->data() + opt_.begin(rank()), mine);
        comm_.allgather_blocks(all->data(), counts_, "the optimizer state's gathering for a checkpoint");
    }
}

}  // namespace anvil
