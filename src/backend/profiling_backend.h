// ProfilingBackend: wraps any Backend and times every op (synchronising after each, so the figures are
// per-op device time, at the cost of any overlap). `anvil train --profile` prints its table and writes it
// as profile.json in the run directory. Matrix products get their GFLOP/s; memory-bound ops get the least
// bytes they must move (each input read once, each output written once) over their time: their achieved
// bandwidth, to hold against a device-to-device copy (`anvil bench`).
#pragma once

#include <chrono>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "backend/backend.h"

namespace anvil {

class ProfilingBackend final : public Backend {
public:
    explicit ProfilingBackend(Backend& inner) : in_(inner) {}
    Device device() const override { return in_.device(); }
    std::string describe() const override { return in_.describe() + " [profiled]"; }
    std::string device_name() const override { return in_.device_name(); }
    // Per-op table: calls, total ms, share, GFLOP/s for matrix products, GB/s for memory-bound ops;
    // sorted by total time.
    std::string report() const;
    nlohmann::json report_json() const;  // the same rows as objects
    void reset() { stats_.clear(); }
    void stop() { stopped_ = true; }  // later ops run untimed (the final checkpoint's copies are not a step)

    Buffer alloc(size_t bytes) override { return in_.alloc(bytes); }
    Buffer alloc_host(size_t bytes) override { return in_.alloc_host(bytes); }
    void zero(Tensor t) override {
        timed("zero", t.nbytes(), [&] { in_.zero(t); });
    }
    void upload(Tensor dst, const void* h) override {
        timed("upload", 0, [&] { in_.upload(dst, h); });
    }
    void download(void* h, Tensor src) override {
        timed("download", 0, [&] { in_.download(h, src); });
    }
    void download_async(void* h, Tensor src) override {
        timed("download", 0, [&] { in_.download_async(h, src); });
    }
    void convert(Tensor d, Tensor s) override {
        timed("convert", d.nbytes() + s.nbytes(), [&] { in_.convert(d, s); });
    }
    void synchronize() override { in_.synchronize(); }
    size_t memory_in_use() const override { return in_.memory_in_use(); }
    size_t memory_peak() const override { return in_.memory_peak(); }
    void set_memory_limit(size_t bytes) override { in_.set_memory_limit(bytes); }

    void embedding_fwd(Tensor o, Tensor t, Tensor w, Tensor p) override {
        timed("embedding_fwd", 3 * o.nbytes() + t.nbytes(), [&] { in_.embedding_fwd(o, t, w, p); });
    }
    void embedding_bwd(Tensor dw, Tensor dp, Tensor d, Tensor t) override {
        timed("embedding_bwd", d.nbytes() + 2 * dp.nbytes() + t.nbytes(),
              [&] { in_.embedding_bwd(dw, dp, d, t); });
    }
    void layernorm_fwd(Tensor o, Tensor m, Tensor r, Tensor i, Tensor w, Tensor b) override {
        timed("layernorm_fwd", i.nbytes() + o.nbytes() + w.nbytes() + b.nbytes() + m.nbytes() + r.nbytes(),
              [&] { in_.layernorm_fwd(o, m, r, i, w, b); });
    }
    void layernorm_bwd(Tensor di, Tensor dw, Tensor db, Tensor d, Tensor i, Tensor w, Tensor m,
                       Tensor r) override {
        timed("layernorm_bwd",
              d.nbytes() + i.nbytes() + 2 * di.nbytes() + w.nbytes() + 2 * (dw.nbytes() + db.nbytes()) +
                  m.nbytes() + r.nbytes(),
              [&] { in_.layernorm_bwd(di, dw, db, d, i, w, m, r); });
    }
    void rmsnorm_fwd(Tensor o, Tensor r, Tensor i, Tensor w, float eps) override {
        timed("rmsnorm_fwd", i.nbytes() + o.nbytes() + w.nbytes() + r.nbytes(),
              [&] { in_.rmsnorm_fwd(o, r, i, w, eps); });
    }
    void rmsnorm_bwd(Tensor di, Tensor dw, Tensor d, Tensor i, Tensor w, Tensor r) override {
        timed("rmsnorm_bwd",
              d.nbytes() + i.nbytes() + 2 * di.nbytes() + w.nbytes() + 2 * dw.nbytes() + r.nbytes(),
              [&] { in_.rmsnorm_bwd(di, dw, d, i, w, r); });
    }
    void rope(Tensor x, Tensor f, int h, int pos0, bool inv) override {
        timed("rope", 2 * x.nbytes(), [&] { in_.rope(x, f, h, pos0, inv); });
    }
    void rope_rows(Tensor x, Tensor f, int h, std::span<const int> pos, bool inv) override {
        timed("rope", 2 * x.nbytes(), [&] { in_.rope_rows(x, f, h, pos, inv); });
    }
    void swiglu_fwd(Tensor o, Tensor g, Tensor u) override {
        timed("swiglu_fwd", o.nbytes() + g.nbytes() + u.nbytes(), [&] { in_.swiglu_fwd(o, g, u); });
    }
    void swiglu_bwd(Tensor dg, Tensor du, Tensor d, Tensor g, Tensor u) override {
        timed("swiglu_bwd", dg.nbytes() + du.nbytes() + d.nbytes() + g.nbytes() + u.nbytes(),
              [&] { in_.swiglu_bwd(dg, du, d, g, u); });
    }
    void qkv_pack(Tensor qkv, Tensor q, Tensor k, Tensor v, int nh) override {
        timed("qkv_pack", qkv.nbytes() + q.nbytes() + k.nbytes() + v.nbytes(),
              [&] { in_.qkv_pack(qkv, q, k, v, nh); });
    }
    void qkv_unpack(Tensor dq, Tensor dk, Tensor dv, Tensor dqkv, int nh) override {
        timed("qkv_unpack", dqkv.nbytes() + dq.nbytes() + dk.nbytes() + dv.nbytes(),
              [&] { in_.qkv_unpack(dq, dk, dv, dqkv, nh); });
    }
    void matmul_fwd(Tensor o, Tensor i, Tensor w, WLayout l, Tensor b, Tensor pg) override {
        timed(matmul_name(pg.empty() ? "matmul_fwd" : "matmul_fwd+gelu", o, i).c_str(), 0,
              [&] { in_.matmul_fwd(o, i, w, l, b, pg); });
    }
    void matmul_bwd(Tensor di, Tensor dw, Tensor db, Tensor d, Tensor i, Tensor w, WLayout l,
                    Tensor pg) override {
        timed(matmul_name(pg.empty() ? "matmul_bwd" : "matmul_bwd+gelu", d, i).c_str(), 0,
              [&] { in_.matmul_bwd(di, dw, db, d, i, w, l, pg); });
    }
    void matmul_fp8_fwd(Tensor o, Tensor i, Tensor w, WLayout l, Tensor b, Tensor pg) override {
        timed(matmul_name(pg.empty() ? "matmul_fp8_fwd" : "matmul_fp8_fwd+gelu", o, i).c_str(), 0,
              [&] { in_.matmul_fp8_fwd(o, i, w, l, b, pg); });
    }
    void matmul_fp8_bwd(Tensor di, Tensor dw, Tensor db, Tensor d, Tensor i, Tensor w, WLayout l,
                        Tensor pg) override {
        timed(matmul_name(pg.empty() ? "matmul_fp8_bwd" : "matmul_fp8_bwd+gelu", d, i).c_str(), 0,
              [&] { in_.matmul_fp8_bwd(di, dw, db, d, i, w, l, pg); });
    }
    void matmul_q8_fwd(Tensor o, Tensor i, Tensor q, Tensor s, WLayout l, Tensor b, Tensor pg) override {
        timed(matmul_name(pg.empty() ? "matmul_q8_fwd" : "matmul_q8_fwd+gelu", o, i).c_str(), 0,
              [&] { in_.matmul_q8_fwd(o, i, q, s, l, b, pg); });
    }
    void matmul_q8_bwd(Tensor di, Tensor d, Tensor q, Tensor s, WLayout l, Tensor pg) override {
        timed(matmul_name(pg.empty() ? "matmul_q8_bwd" : "matmul_q8_bwd+gelu", d, di).c_str(), 0,
              [&] { in_.matmul_q8_bwd(di, d, q, s, l, pg); });
    }
    void embedding_rows_add(Tensor o, Tensor t, std::span<const int> rows) override {
        timed("embedding_fwd", 3 * o.nbytes(), [&] { in_.embedding_rows_add(o, t, rows); });
    }
    void embedding_q8_fwd(Tensor o, Tensor t, Tensor q, Tensor s, Tensor p) override {
        timed("embedding_q8_fwd", o.nbytes() + o.nbytes() / 4 + t.nbytes() + (p.empty() ? 0 : o.nbytes()),
              [&] { in_.embedding_q8_fwd(o, t, q, s, p); });
    }
    void gelu_fwd(Tensor o, Tensor i) override {
        timed("gelu_fwd", o.nbytes() + i.nbytes(), [&] { in_.gelu_fwd(o, i); });
    }
    void gelu_bwd(Tensor di, Tensor d, Tensor i) override {
        timed("gelu_bwd", di.nbytes() + d.nbytes() + i.nbytes(), [&] { in_.gelu_bwd(di, d, i); });
    }
    size_t attention_saved_elems(const AttnDims& d) const override { return in_.attention_saved_elems(d); }
    size_t attention_scratch_elems(const AttnDims& d) const override {
        return in_.attention_scratch_elems(d);
    }
    bool set_autocast(DType products) override { return in_.set_autocast(products); }
    void attention_fwd(Tensor o, Tensor s, Tensor q, int nh, const AttnDropout& dr) override {
        timed("attention_fwd", 0, [&] { in_.attention_fwd(o, s, q, nh, dr); });
    }
    void attention_bwd(Tensor dq, Tensor sc, Tensor d, Tensor q, Tensor o, Tensor s, int nh,
                       const AttnDropout& dr) override {
        timed("attention_bwd", 0, [&] { in_.attention_bwd(dq, sc, d, q, o, s, nh, dr); });
    }
    void attention_cached(Tensor o, Tensor q, Tensor k, Tensor v, int p, int nh) override {
        timed("attention_cached", 0, [&] { in_.attention_cached(o, q, k, v, p, nh); });
    }
    void attention_cached_rows(Tensor o, Tensor q, Tensor k, Tensor v, Tensor pg, std::span<const int> slot,
                               std::span<const int> pos, int nh) override {
        timed("attention_cached", 0, [&] { in_.attention_cached_rows(o, q, k, v, pg, slot, pos, nh); });
    }
    void residual_fwd(Tensor o, Tensor a, Tensor b) override {
        timed("residual_fwd", o.nbytes() + a.nbytes() + b.nbytes(), [&] { in_.residual_fwd(o, a, b); });
    }
    void scale(Tensor x, float s) override {
        timed("scale", 2 * x.nbytes(), [&] { in_.scale(x, s); });
    }
    void dropout(Tensor o, Tensor i, float p, uint64_t seed) override {
        timed("dropout", o.nbytes() + i.nbytes(), [&] { in_.dropout(o, i, p, seed); });
    }
    void classifier(Tensor l, Tensor lg, Tensor t, float d, int v) override {
        timed("classifier", lg.nbytes() * (d != 0.0f ? 2 : 1) + l.nbytes() + t.nbytes(),
              [&] { in_.classifier(l, lg, t, d, v); });
    }
    void token_logprobs(Tensor lp, Tensor ids, Tensor top, Tensor lg, Tensor t, int v) override {
        timed("token_logprobs", lg.nbytes() + lp.nbytes() + ids.nbytes() + top.nbytes() + t.nbytes(),
              [&] { in_.token_logprobs(lp, ids, top, lg, t, v); });
    }
    void global_norm_sq(Tensor o, const std::vector<Tensor>& g) override {
        timed("global_norm", total_bytes(g), [&] { in_.global_norm_sq(o, g); });
    }
    void adamw(const std::vector<ParamSlot>& s, const AdamWArgs& a, Tensor n) override {
        timed("adamw", adamw_bytes(s), [&] { in_.adamw(s, a, n); });
    }
    std::unique_ptr<DeviceCollectives> make_collectives(const CollectiveSetup& s) override {
        return in_.make_collectives(s);
    }

private:
    // "matmul_fwd 1024x256>768": rows x in > out
    static std::string matmul_name(const char* op, const Tensor& out, const Tensor& in) {
        const int64_t oc = out.shape[out.shape.ndim - 1], ic = in.shape[in.shape.ndim - 1];
        return std::string(op) + " " + std::to_string(in.numel() / ic) + "x" + std::to_string(ic) + ">" +
               std::to_string(oc);
    }
    static size_t total_bytes(const std::vector<Tensor>& ts) {
        size_t n = 0;
        for (const Tensor& t : ts) n += t.nbytes();
        return n;
    }
    // parameters, master copy and moments read and written, gradients read
    static size_t adamw_bytes(const std::vector<ParamSlot>& slots) {
        size_t n = 0;
        for (const ParamSlot& s : slots)
            n += 2 * (s.param.nbytes() + s.m.nbytes() + s.v.nbytes() +
                      (s.master.empty() ? 0 : s.master.nbytes())) +
                 s.grad.nbytes();
        return n;
    }
    // bytes: the least the op must move, 0 where the op is bound by arithmetic (matrix products, attention)
    template <typename F>
    void timed(const char* name, size_t bytes, F&& f) {
        if (stopped_) return f();
        in_.synchronize();  // earlier asynchronous work is not this op's
        const auto t0 = std::chrono::steady_clock::now();
        f();
        in_.synchronize();
        Stat& s = stats_[name];
        s.calls++;
        s.bytes += double(bytes);
        s.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    struct Stat {
        int64_t calls = 0;
        double seconds = 0.0;
        double bytes = 0.0;
    };
    Backend& in_;
    std::map<std::string, Stat> stats_;
    bool stopped_ = false;
};

}  // namespace anvil
