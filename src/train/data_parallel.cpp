#include "train/data_parallel.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace anvil {

std::vector<size_t> zero_bounds(const ParamStore& store, const AdamW& opt) {
    const std::vector<Tensor> arena = store.grad_tensors();
    ANVIL_CHECK(arena.size() == 1, "--zero 1: ZeRO-1 needs every trainable entry in one dtype");
    const auto element = [&](size_t i) {  // entry i's first gradient element in the arena
        return size_t(static_cast<const char*>(store.grad(i).data) -
                      static_cast<const char*>(arena[0].data)) /
               dtype_size(arena[0].dtype);
    };
    const std::vector<size_t>& tr = store.trainable();
    std::vector<size_t> b;
    size_t k = 0;  // the first entry that does not end at or before the range's start
    for (int r = 0; r <= opt.shard().world; r++) {
        const size_t x = opt.begin(r);
        while (k < tr.size() && opt.offset(tr[k]) + size_t(store.spec(tr[k]).shape.numel()) <= x) k++;
        if (k == tr.size()) {
            b.push_back(size_t(arena[0].numel()));
            continue;
        }
        const size_t o = opt.offset(tr[k]);
        b.push_back(element(tr[k]) + (x > o ? x - o : 0));
    }
    return b;
}

DataParallel::DataParallel(const ProcessGrid& grid, ParamStore& store, const AdamW& opt, bool even_alone,
                           bool zero_alone)
    : world_(*grid.world),
      comm_(*grid.dp),
      tp_(grid.tp),
      store_(store),
      opt_(opt),
      zero_(opt.sharded() || (even_alone && zero_alone)) {
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
    const std::vector<size_t>& tr = store.trainable();
    if (tr.empty()) return;
    Backend& be = store.backend();
    if (be.device() != Device::CPU)  // device memory: the backend's collectives (NCCL)
        device_ = make_device_collectives(comm_, be, "data parallelism");
    if (zero_) {
        ANVIL_CHECK(opt.shard().world == comm_.size(),
                    "ZeRO-1: the optimizer is sharded {} ways over {} ranks", opt.shard().world,
                    comm_.size());
        grads_ = store.grad_tensors()[0];
        bounds_ = zero_bounds(store, opt);
    }
    int layers = 0;
    for (size_t i : tr) layers = std::max(layers, store.spec(i).layer + 1);
    buckets_.resize(size_t(layers) + 1);
    const char* op = zero_ ? "reduce (ZeRO-1)" : "all-reduce";
    for (int l = -1; l < layers; l++)
        bucket(l).what = l < 0 ? fmt::format("the gradient {} of the embeddings, final norm and head", op)
                               : fmt::format("the gradient {} of layer {}", op, l);
    // Runs of consecutive trainable entries of one layer and dtype are one span of the gradient arena (the
    // padding between entries is zero and stays zero when summed). ZeRO-1 cuts a span where the ranks' runs
    // meet and sums each piece on its owner.
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
        Bucket& b = bucket(layer);
        if (!zero_) {
            b.spans.push_back(span);
            b.roots.push_back(-1);
        } else {
            const size_t s0 = size_t(static_cast<const char*>(span.data) -
                                     static_cast<const char*>(grads_.data)) /
                              dtype_size(dt),
                         s1 = s0 + size_t(span.numel());
            for (int r = 0; r < comm_.size(); r++) {
                const size_t a = std::max(s0, bounds_[size_t(r)]), z = std::min(s1, bounds_[size_t(r) + 1]);
                if (a >= z) continue;
                b.spans.push_back(grads_.range(int64_t(a), int64_t(z - a)));
                b.roots.push_back(r);
            }
        }
        bytes_ += bytes;
        k = e;
    }
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
    if (!armed_ || buckets_.empty()) return;
    const Bucket& b = bucket(layer);
    for (size_t k = 0; k < b.spans.size(); k++) {
        const Tensor& s = b.spans[k];
        const int root = b.roots[k];
        if (device_ && root < 0)
            device_->allreduce_sum_start(s, b.what.c_str());
        else if (device_)
            device_->reduce_sum_start(s, root, b.what.c_str());
        else if (root < 0)
            pending_.push_back(comm_.allreduce_sum_start(s.f32(), size_t(s.numel()), b.what.c_str()));
        else
            pending_.push_back(comm_.reduce_sum_start(s.f32(), size_t(s.numel()), root, b.what.c_str()));
    }
    comm_.progress();
}

void DataParallel::finish() {
    const auto t0 = std::chrono::steady_clock::now();
    for (const Comm::Pending& p : pending_) comm_.wait(p);
    pending_.clear();
    if (device_) device_->wait_all();
    armed_ = false;
    exposed_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (fp8_state_.empty()) return;
    // (a few floats a linear layer: through the host, once a step)
    Backend& be = store_.backend();
    const std::vector<float> mine = be.download_f32(fp8_state_);
    std::vector<float> all(mine.size() * size_t(comm_.size()));
    comm_.allgather(mine.data(), mine.size() * sizeof(float), all.data(), "the FP8 amax histories' maximum");
    std::vector<float> top = mine;
    for (size_t r = 0; r < size_t(comm_.size()); r++)
        for (size_t i = 0; i < top.size(); i++) top[i] = std::max(top[i], all[r * top.size() + i]);
    be.upload(fp8_state_, top.data());
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
    if (!zero_ || bounds_.empty()) return be.global_norm_sq(out, store_.grad_tensors());
    // ZeRO-1: this rank's run is the only summed part
    const size_t r = size_t(rank());
    std::vector<Tensor> mine;
    if (bounds_[r + 1] > bounds_[r])
        mine.push_back(grads_.range(int64_t(bounds_[r]), int64_t(bounds_[r + 1] - bounds_[r])));
    double all = norm_sq_of(out, mine);
    comm_.allreduce_sum(&all, 1, "the gradient norm's sum (ZeRO-1)");
    const float all_f = float(all);
    be.upload(out, &all_f);
}

void DataParallel::after_update() {
    if (!zero_ || bounds_.empty()) return;
    Backend& be = store_.backend();
    // this rank's updated weights into its run of the gradient memory, every run to every rank, then back
    for (const AdamW::Piece& p : opt_.pieces()) be.convert(p.grad, p.param);
    std::vector<size_t> counts;
    for (size_t r = 0; r + 1 < bounds_.size(); r++) counts.push_back(bounds_[r + 1] - bounds_[r]);
    const char* what = "the weight all-gather (ZeRO-1)";
    if (device_) {
        device_->allgather_blocks_start(grads_, counts, what);
        device_->wait_all_on_device();  // the conversions below are queued after it
    } else {
        comm_.allgather_blocks(grads_.f32(), counts, what);
    }
    for (size_t i : store_.trainable()) be.convert(store_.param(i), store_.grad(i));
}

void DataParallel::gather_state(std::vector<float>& m_all, std::vector<float>& v_all,
                                std::vector<float>& master_all) {
    const std::vector<size_t> counts = opt_.range_sizes();
    const auto gather = [&](std::vector<float>& all, Tensor mine) {
        all.assign(opt_.layout_floats(), 0.0f);
        store_.backend().download(all.data() + opt_.begin(rank()), mine);
        comm_.allgather_blocks(all.data(), counts, "the optimizer state's gathering for a checkpoint");
    };
    gather(m_all, opt_.m_range());
    gather(v_all, opt_.v_range());
    master_all.clear();
    if (opt_.has_master()) gather(master_all, opt_.master_range());
}

}  // namespace anvil
