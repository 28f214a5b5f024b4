#include "backend/backend.h"

namespace anvil {

AttentionImpl parse_attention(const std::string& name) {
    if (name == "auto") return AttentionImpl::Auto;
    if (name == "gemm") return AttentionImpl::Gemm;
    if (name == "flash") return AttentionImpl::Flash;
    fail("--attention {}: use auto, gemm or flash", name);
}

}  // namespace anvil
