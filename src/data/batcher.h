// Which tokens go into batch i. This order is part of anvil's contract (README, "Data order"):
//
//  --shuffle off: batch i of a one-process run is the window of B*T+1 tokens starting at token i*B*T of
//    the training split (indices taken modulo its length, so it wraps), cut into B rows of T+1; row b's
//    inputs are its first T tokens and its targets the last T. A target is -1 (ignored) where the token is
//    not in the loss (prompt tokens of instruction records), and where it belongs to an instruction
//    record's output but that record began before the row: the model never learns an answer whose
//    question it cannot see.
//  --shuffle on: rows start at window starts. Each record (a JSONL line, or the whole of a text file) is
//    cut into windows from its own first token: starts s, s+T, s+2T, ... while inside the record (a text
//    file: W = floor((N-1)/T) windows at multiples of T). A window is T+1 tokens; a short record's window
//    runs on into the records after it. Rows starting at record boundaries keep every prompt at the same
//    positions, which small models learn far faster than prompts at arbitrary offsets. Row r (counting rows
//    across batches, r = i*B + b) takes window perm_e[r mod W] of epoch e = r / W, perm_e being a seeded
//    Fisher-Yates permutation: every window is served once per epoch. With several data-parallel ranks,
//    rank k of K takes global rows r*K + k.
//  --augment (shuffle on): the windows and their order stay the unaugmented stream's; a row's records are
//    re-rendered for its epoch (data/augment.h's RecordAugmenter), the window's own from the same offset
//    (its last token at most), the records after it whole, until the row is full.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "data/augment.h"
#include "data/dataset.h"

namespace anvil {

class Batcher {
public:
    Batcher(TokenView s, int B, int T, bool shuffle, uint64_t seed, int rank = 0, int world = 1);
    // Batch `index` into tokens (B*T) and targets (B*T); with `lengths` (B*T), each position's record
    // length within its row (--neftune-alpha's L): a record starts at a record's first token or at the row's
    // start, and runs to the next record's first token or the row's end.
    void fill(int64_t index, int32_t* tokens, int32_t* targets, int32_t* lengths = nullptr);
    int64_t windows() const { return int64_t(starts_.size()); }
    // --augment; needs shuffle on and `a->examples` one a record of the stream
    void set_augmenter(std::shared_ptr<const RecordAugmenter> a);

private:
    void fill_row(int64_t start, int32_t* tokens, int32_t* targets, int32_t* lengths) const;
    void fill_augmented_row(int64_t start, uint64_t epoch, int32_t* tokens, int32_t* targets,
                            int32_t* lengths) const;
    const std::vector<uint32_t>& permutation(int64_t epoch);

    TokenView s_;
    int B_, T_;
    bool shuffle_;
    uint64_t seed_;
    int rank_, world_;
    std::vector<uint64_t> starts_;  // window starts (shuffle on)
    std::vector<uint32_t> perm_;
    int64_t perm_epoch_ = -1;
    std::shared_ptr<const RecordAugmenter> aug_;
    std::vector<uint64_t> records_;  // with aug_: each record's first token
};

// Evaluation windows: the same record-aligned windows as training (starts from window_starts with
// cover_tail), without wrapping. Window w scores only the targets after its start up to the next
// window's start, so every target is scored exactly once and always with its own record's prompt in view.
// Rows past the last window, and positions past the end, get target -1.
// Window starts for --shuffle on (see above). With cover_tail, windows that run past the end are kept
// too (evaluation scores every target; training drops them rather than wrap).
std::vector<uint64_t> window_starts(const TokenView& s, int T, bool cover_tail = false);

int64_t eval_batches(const std::vector<uint64_t>& starts, int B);
void fill_eval_batch(const TokenView& s, const std::vector<uint64_t>& starts, int B, int T, int64_t index,
                     int32_t* tokens, int32_t* targets);

}  // namespace anvil
