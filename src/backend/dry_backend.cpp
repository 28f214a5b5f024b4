#include "backend/dry_backend.h"

#include <fmt/format.h>
#include <algorithm>

#include "backend/device_sizes.h"

namespace anvil {

namespace {
// Where every dry allocation "is": aligned, never dereferenced (DryBackend's ops and copies do nothing).
void* const kNowhere = reinterpret_cast<void*>(uintptr_t(kAlign));
}  // namespace

DryBackend::DryBackend(const DryTarget& t) : target_(t) {
    target_.threads = std::max(1, target_.threads);
    if (t.device == Device::CUDA) {  // held from the start, as CudaBackend's constructor allocates them
        workspace_ = alloc(sizes::kCudaWorkspaceBytes);
        lt_workspace_ = alloc(sizes::kCudaLtWorkspaceBytes);
        direct_done_ = alloc(sizes::kCudaDirectDoneBytes);
    }
}

std::string DryBackend::describe() const {
    return target_.device == Device::CUDA
               ? "dry run (the CUDA backend's accounting)"
               : fmt::format("dry run (the CPU backend's accounting, {} threads)", target_.threads);
}

Buffer DryBackend::alloc(size_t bytes) {
    const size_t rounded = memory_.admit(bytes);
    return memory_.track(kNowhere, bytes, rounded, target_.device, [](void*) {});
}

Buffer DryBackend::alloc_host(size_t bytes) {
    if (target_.device == Device::CPU) return alloc(bytes);
    return Buffer(kNowhere, bytes, Device::CPU, [](void*) {});
}

size_t DryBackend::attention_saved_elems(const AttnDims& d) const {
    if (target_.device == Device::CPU) return sizes::cpu_attention_saved_elems(d);
    // the flash kernels take the tensor cores in 16-bit types at head sizes up to 128 (the card's shared
    // memory is assumed to fit their tiles, as on every card anvil plans for)
    const bool tensor_cores = d.dtype != DType::F32 && d.HS <= 128;
    return sizes::cuda_attention_saved_elems(
        d, sizes::cuda_gemm_planned(target_.attention, d, tensor_cores, sizes::cuda_gemm_fits(d)));
}

size_t DryBackend::fp8_kept_elems(int N, int C, int OC, DType dt) const {
    return target_.device == Device::CPU ? 0 : sizes::cuda_fp8_kept_elems(N, C, OC, dt);
}

size_t DryBackend::attention_scratch_elems(const AttnDims& d) const {
    if (target_.device == Device::CPU) return sizes::cpu_attention_scratch_elems(d, target_.threads);
    return sizes::cuda_attention_scratch_elems(d);
}

}  // namespace anvil
