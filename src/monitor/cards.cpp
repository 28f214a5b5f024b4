#include "monitor/cards.h"

#include <fmt/format.h>

namespace anvil {

const char* const kPriceSource =
    "on-demand list prices per card, 2025 (Lambda: A100, H100; RunPod: H200, L40S, RTX 4090, RTX 3090, A10); "
    "they change and differ by provider: pass your own with --price KIND=USD";
const char* const kLinkSource =
    "nccl-tests all-reduce bus bandwidths: H100/H200 SXM NVLink 460 GB/s and 400 GB/s over InfiniBand NDR "
    "(bench/results/2026-11-24-step-time-model.json), A100 SXM 240 GB/s; PCIe cards assumed 20 GB/s in a "
    "node (Gen4 x16, no NVLink) and 12.5 GB/s (100 GbE) across nodes";

const std::vector<CardKind>& card_kinds() {
    // memory: as `anvil doctor` read it on the H100 and the H200, the others from their datasheets
    // clang-format off
    // kind, alias, name, datasheet row, GiB, the node's link, the network's, cards a node, $/h, planned
    static const std::vector<CardKind> kinds = {
        {"a100-40", "", "A100 40GB SXM", "A100-SXM4-40GB", 39.6, {240e9, 20e-6}, {200e9, 40e-6}, 8, 1.29, true},
        {"a100-80", "a100", "A100 80GB SXM", "A100-SXM4-80GB", 79.2, {240e9, 20e-6}, {200e9, 40e-6}, 8, 1.79, true},
        {"h100", "h100-sxm", "H100 80GB SXM", "H100", 79.18, {460e9, 20e-6}, {400e9, 40e-6}, 8, 2.99, true},
        {"h200", "", "H200 141GB SXM", "H200", 139.8, {460e9, 20e-6}, {400e9, 40e-6}, 8, 3.99, true},
        {"l40s", "", "L40S 48GB", "L40S", 44.99, {20e9, 30e-6}, {12.5e9, 60e-6}, 8, 0.86, true},
        {"rtx4090", "4090", "GeForce RTX 4090 24GB", "RTX 4090", 23.99, {20e9, 30e-6}, {12.5e9, 60e-6}, 8, 0.69, true},
        {"rtx3090", "3090", "GeForce RTX 3090 24GB", "RTX 3090", 24.0, {20e9, 30e-6}, {12.5e9, 60e-6}, 8, 0.43, true},
        {"h100-pcie", "", "H100 80GB PCIe", "H100 PCIe", 79.18, {20e9, 30e-6}, {50e9, 60e-6}, 8, 2.49, false},
        {"a10", "", "A10 24GB", "A10", 22.0, {20e9, 30e-6}, {12.5e9, 60e-6}, 8, 0.75, false},
    };
    // clang-format on
    return kinds;
}

const CardKind* find_card(const std::string& kind) {
    for (const CardKind& c : card_kinds())
        if (kind == c.kind || (*c.alias && kind == c.alias)) return &c;
    return nullptr;
}

std::string card_kind_names() {
    std::string s;
    for (const CardKind& c : card_kinds())
        s += fmt::format("{}{}{}", s.empty() ? "" : ", ", c.kind,
                         *c.alias ? fmt::format(" ({})", c.alias) : "");
    return s;
}

const std::vector<SpeedRecord>& speed_records() {
    // GPT-2 124M (12 x 768, 12 heads, vocabulary 50304), `anvil train` through bench/gpu_train_bench.py and
    // bench/gpu_fp8_bench.py on the cards themselves
    // clang-format off
    static const std::vector<SpeedRecord> records = {
        {"h100", "2026-11-27-h100.json",     "6f80acc", "bf16", 12, 768, 12, 50304, 16, 1024, 1, 405330},
        {"h200", "2026-11-27-h200-b16.json", "e599c36", "bf16", 12, 768, 12, 50304, 16, 1024, 1, 458192},
        {"h200", "2026-11-27-h200.json",     "e599c36", "bf16", 12, 768, 12, 50304, 64, 1024, 8, 500834},
        {"h200", "2026-11-27-h200-fp8.json", "e599c36", "fp8",  12, 768, 12, 50304, 16, 1024, 1, 356739},
    };
    // clang-format on
    return records;
}

}  // namespace anvil
