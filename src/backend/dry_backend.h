// DryBackend: a backend that holds no memory and runs nothing. It counts what a model, its optimizer and its
// activations ask of a target device (the CPU backend's accounting, or the CUDA backend's) without touching
// memory, so `anvil plan` sizes a 70B model on a laptop through the same code a run allocates with: the
// parameter store, AdamW's state, the activation plan. Allocations get an address no one may read; ops,
// copies and uploads do nothing.
#pragma once

#include "backend/backend.h"
#include "backend/memory_account.h"

namespace anvil {

struct DryTarget {
    Device device = Device::CPU;  // whose accounting: the CPU backend's or the CUDA backend's
    int threads = 1;              // CPU: the threads attention's backward keeps scratch for
    AttentionImpl attention = AttentionImpl::Auto;  // CUDA: what attention keeps (backend.h)
};

class DryBackend final : public Backend {
public:
    explicit DryBackend(const DryTarget& t);
    Device device() const override { return target_.device; }
    std::string describe() const override;
    std::string device_name() const override { return "dry run"; }

    // Counted (and limited, set_memory_limit) as the target backend counts; no memory behind it. Host memory
    // is the device's on the CPU, and not device memory on CUDA.
    Buffer alloc(size_t bytes) override;
    Buffer alloc_host(size_t bytes) override;
    void zero(Tensor) override {}
    void upload(Tensor, const void*) override {}
    void download(void*, Tensor) override {}
    void download_async(void*, Tensor) override {}
    void convert(Tensor, Tensor) override {}
    void synchronize() override {}
    size_t memory_in_use() const override { return memory_.in_use(); }
    size_t memory_peak() const override { return memory_.peak(); }
    void set_memory_limit(size_t bytes) override { memory_.set_limit(bytes); }
    bool set_autocast(DType products) override { return products == DType::BF16 || products == DType::F32; }

    size_t attention_saved_elems(const AttnDims& d) const override;
    size_t attention_scratch_elems(const AttnDims& d) const override;
    size_t fp8_kept_elems(int N, int C, int OC, DType dt) const override;

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#define ANVIL_OP(name, params, args, rule, label, bytes) \
    void name params override {}
#define ANVIL_OP_CUSTOM(name, params, args, label, bytes) \
    void name params override {}
#include "backend/ops.def"
#pragma GCC diagnostic pop

private:
    DryTarget target_;
    MemoryAccount memory_;
    Buffer workspace_, lt_workspace_, direct_done_;  // CUDA: what its constructor allocates
};

}  // namespace anvil
