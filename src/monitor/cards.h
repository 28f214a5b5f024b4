// The GPU kinds anvil plans for: memory, links and an hourly price per card, and the speeds anvil measured on
// some of them (the records under bench/results/, which tests/cli/test_plan.py checks these against). Matrix
// rates come from the datasheet table (hwbench.h); --price-per-hour's presets are the same prices.
#pragma once

#include <string>
#include <vector>

namespace anvil {

struct Link {
    double busbw = 0;  // an all-reduce's bus bandwidth as nccl-tests reports it, bytes/s
    double alpha = 0;  // seconds per collective
};

struct CardKind {
    const char* kind;       // what --gpus and --price take: "h100"
    const char* alias;      // another name it answers to ("" none)
    const char* name;       // "H100 80GB SXM"
    const char* datasheet;  // its row in the datasheet table (find_datasheet)
    double memory_gib;      // device memory as the driver reports it
    Link node, net;         // all-reduce inside a node of `per_node` cards; across nodes
    int per_node;
    double usd_per_hour;  // on-demand, one card
    bool planned;         // in anvil plan's default list
};

// Every kind, in the order anvil plan lists them.
const std::vector<CardKind>& card_kinds();
// By kind or alias ("h100", "a100"); nullptr when unknown.
const CardKind* find_card(const std::string& kind);
// "a100-40, a100-80 (a100), h100, ..." for messages and --help.
std::string card_kind_names();
// Where the prices and links come from, for the text table and --json.
extern const char* const kPriceSource;
extern const char* const kLinkSource;

// anvil's own measured training speed on a card: GPT-2 shaped (layers x dim, heads, vocabulary), a
// micro-batch of batch x seq with accum micro-batches a step, in a precision; from bench/results/<file>.
struct SpeedRecord {
    const char* kind;
    const char* file;
    const char* commit;
    const char* precision;  // bf16, fp8
    int layers, dim, heads, vocab, batch, seq, accum;
    double tokens_per_s;
};
const std::vector<SpeedRecord>& speed_records();

}  // namespace anvil
