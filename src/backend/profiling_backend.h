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
    void reset() {
        stats_.clear();
        calls_.clear();
    }
    // Calls by op name (ops.def's names, and zero, upload, download, convert), counted even after stop().
    const std::map<std::string, int64_t>& op_calls() const { return calls_; }
    void stop() { stopped_ = true; }  // later ops run untimed (the final checkpoint's copies are not a step)

    Buffer alloc(size_t bytes) override { return in_.alloc(bytes); }
    Buffer alloc_host(size_t bytes) override { return in_.alloc_host(bytes); }
    void zero(Tensor t) override {
        timed("zero", "zero", t.nbytes(), [&] { in_.zero(t); });
    }
    void upload(Tensor dst, const void* h) override {
        timed("upload", "upload", 0, [&] { in_.upload(dst, h); });
    }
    void download(void* h, Tensor src) override {
        timed("download", "download", 0, [&] { in_.download(h, src); });
    }
    void download_async(void* h, Tensor src) override {
        timed("download", "download", 0, [&] { in_.download_async(h, src); });
    }
    void convert(Tensor d, Tensor s) override {
        timed("convert", "convert", d.nbytes() + s.nbytes(), [&] { in_.convert(d, s); });
    }
    void synchronize() override { in_.synchronize(); }
    size_t memory_in_use() const override { return in_.memory_in_use(); }
    size_t memory_peak() const override { return in_.memory_peak(); }
    void set_memory_limit(size_t bytes) override { in_.set_memory_limit(bytes); }

    size_t attention_saved_elems(const AttnDims& d) const override { return in_.attention_saved_elems(d); }
    size_t fp8_kept_elems(int N, int C, int OC, DType dt) const override {
        return in_.fp8_kept_elems(N, C, OC, dt);
    }
    size_t attention_scratch_elems(const AttnDims& d) const override {
        return in_.attention_scratch_elems(d);
    }
    bool set_autocast(DType products) override { return in_.set_autocast(products); }
    // every listed op, timed under its label (ops.def)
#define ANVIL_PROFILED(name, params, args, label, bytes)    \
    void name params override {                             \
        timed(#name, label, bytes, [&] { in_.name args; }); \
    }
#define ANVIL_OP(name, params, args, rule, label, bytes) ANVIL_PROFILED(name, params, args, label, bytes)
#define ANVIL_OP_CUSTOM(name, params, args, label, bytes) ANVIL_PROFILED(name, params, args, label, bytes)
#include "backend/ops.def"
#undef ANVIL_PROFILED
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
    // op: the op's name; label: its row in the table; bytes: the least the op must move, 0 where the op is
    // bound by arithmetic (matrix products, attention)
    template <typename L, typename F>
    void timed(const char* op, const L& label, size_t bytes, F&& f) {
        calls_[op]++;
        if (stopped_) return f();
        in_.synchronize();  // earlier asynchronous work is not this op's
        const auto t0 = std::chrono::steady_clock::now();
        f();
        in_.synchronize();
        Stat& s = stats_[std::string(label)];
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
    std::map<std::string, int64_t> calls_;
    bool stopped_ = false;
};

}  // namespace anvil
