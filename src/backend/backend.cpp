#include "backend/backend.h"

namespace anvil {

AttentionImpl parse_attention(const std::string& name) {
    if (name == "auto") return AttentionImpl::Auto;
    if (name == "gemm") return AttentionImpl::Gemm;
    if (name == "flash") return AttentionImpl::Flash;
    if (name == "flash-simt") return AttentionImpl::FlashSimt;
    if (name == "cudnn") return AttentionImpl::Cudnn;
    fail("--attention {}: use auto, gemm, flash, flash-simt or cudnn", name);
}

std::vector<float> Backend::download_f32(Tensor src) {
    std::vector<uint8_t> raw(src.nbytes());
    download(raw.data(), src);
    std::vector<float> v(size_t(src.numel()));
    convert_to_f32(v.data(), raw.data(), src.dtype, v.size());
    return v;
}

void Backend::argmax_rows(int32_t* out, Tensor logits, int V, Tensor zeros, Tensor lp, Tensor ids,
                          Tensor top) {
    const int64_t N = logits.shape[0];
    token_logprobs(lp, ids.view(Shape{N, 1}), top.view(Shape{N, 1}), logits, zeros, V);
    download(out, ids);
}

}  // namespace anvil
