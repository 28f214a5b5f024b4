#include "data/batcher.h"

#include "core/error.h"
#include "core/rng.h"

#include <algorithm>

namespace anvil {

Batcher::Batcher(TokenView s, int B, int T, bool shuffle, uint64_t seed, int rank, int world)
    : s_(std::move(s)), B_(B), T_(T), shuffle_(shuffle), seed_(seed), rank_(rank), world_(world) {
    ANVIL_CHECK(s_.size() >= size_t(T) + 1,
                "training split has {} tokens, fewer than one sequence of --seq {} + 1; "
                "use a shorter --seq, a smaller --val-fraction or more data",
                s.size(), T);
    ANVIL_CHECK(world >= 1 && rank >= 0 && rank < world, "rank {} of world size {}", rank, world);
    if (shuffle) {
        starts_ = window_starts(s_, T);
        ANVIL_CHECK(starts_.size() < (uint64_t(1) << 32), "too many windows ({}); use a longer --seq",
                    starts_.size());
    }
}

std::vector<uint64_t> window_starts(const TokenView& s, int T, bool cover_tail) {
    std::vector<uint64_t> starts;
    const size_t N = s.size();
    size_t rec = 0;
    while (rec < N) {
        size_t end = rec + 1;
        while (end < N && !(s.flags(end) & kRecordStart)) end++;
        // windows from the record's start; one that would run past the stream's end is dropped unless it is
        // the record's first (then it wraps), so a single text file gets floor((N-1)/T) windows
        for (size_t w = rec; w < end; w += size_t(T))
            if (w + size_t(T) < N || w == rec || cover_tail) starts.push_back(w);
        rec = end;
    }
    return starts;
}

namespace {
// Target of input position i: token j = i+1 if it is in the loss and, for instruction outputs, its record
// started inside the row (prompt_seen).
inline int32_t target_of(const TokenView& s, size_t j, bool prompt_seen) {
    const uint8_t f = s.flags(j);
    const bool ok = (f & kInLoss) && (!(f & kNeedsPrompt) || prompt_seen);
    return ok ? s.id(j) : -1;
}
}  // namespace

namespace {
// Row tokens and targets from `start` of `s` (indices wrapping at its end); with `lengths`, each position's
// record length within the row (a record starts at a kRecordStart token or at the row's start).
void fill_from(const TokenView& s, int64_t start, int T, int32_t* tokens, int32_t* targets,
               int32_t* lengths) {
    const int64_t N = int64_t(s.size());
    bool prompt_seen = false;
    int first = 0;  // the current record's first position in the row
    for (int t = 0; t < T; t++) {
        const size_t i = size_t((start + t) % N), j = size_t((start + t + 1) % N);
        const bool starts = s.flags(i) & kRecordStart;
        prompt_seen = prompt_seen || starts;
        tokens[t] = s.id(i);
        targets[t] = target_of(s, j, prompt_seen);
        if (lengths && starts && t > first) {
            std::fill(lengths + first, lengths + t, t - first);
            first = t;
        }
    }
    if (lengths) std::fill(lengths + first, lengths + T, T - first);
}
}  // namespace

void Batcher::fill_row(int64_t start, int32_t* tokens, int32_t* targets, int32_t* lengths) const {
    fill_from(s_, start, T_, tokens, targets, lengths);
}

void Batcher::set_augmenter(std::shared_ptr<const RecordAugmenter> a) {
    ANVIL_CHECK(shuffle_, "--augment needs --shuffle on (augmented records are drawn per epoch)");
    records_.clear();
    for (size_t i = 0; i < s_.size(); i++)
        if (s_.flags(i) & kRecordStart) records_.push_back(i);
    ANVIL_CHECK(records_.size() == a->examples.size() && !records_.empty() && records_[0] == 0,
                "--augment: {} records in the training stream, {} read", records_.size(), a->examples.size());
    aug_ = std::move(a);
}

void Batcher::fill_augmented_row(int64_t start, uint64_t epoch, int32_t* tokens, int32_t* targets,
                                 int32_t* lengths) const {
    const size_t n = records_.size();
    size_t k =
        size_t(std::upper_bound(records_.begin(), records_.end(), uint64_t(start)) - records_.begin()) - 1;
    uint64_t off = uint64_t(start) - records_[k];
    TokenStream row, rec;
    while (row.size() < size_t(T_) + 1) {
        if (!aug_->augmented(k, epoch, rec)) {  // the record as the stream holds it
            rec.ids.clear(), rec.flags.clear();
            const uint64_t end = k + 1 < n ? records_[k + 1] : s_.size();
            for (uint64_t i = records_[k]; i < end; i++) rec.append_one(s_.id(i), s_.flags(i));
        }
        off = std::min<uint64_t>(off, rec.size() - 1);
        row.ids.insert(row.ids.end(), rec.ids.begin() + long(off), rec.ids.end());
        row.flags.insert(row.flags.end(), rec.flags.begin() + long(off), rec.flags.end());
        off = 0;
        k = (k + 1) % n;
    }
    fill_from(row.view(), 0, T_, tokens, targets, lengths);
}

const std::vector<uint32_t>& Batcher::permutation(int64_t epoch) {
    if (epoch != perm_epoch_) {
        const int64_t W = windows();
        perm_.resize(size_t(W));
        for (int64_t w = 0; w < W; w++) perm_[size_t(w)] = uint32_t(w);
        Rng rng(seed_ * 0x9e3779b97f4a7c15ull + uint64_t(epoch) + 1);
        for (int64_t w = W - 1; w > 0; w--) std::swap(perm_[size_t(w)], perm_[rng.below(uint64_t(w) + 1)]);
        perm_epoch_ = epoch;
    }
    return perm_;
}

void Batcher::fill(int64_t index, int32_t* tokens, int32_t* targets, int32_t* lengths) {
    for (int b = 0; b < B_; b++) {
        int64_t start, epoch = 0;
        if (!shuffle_) {
            start = (index * world_ + rank_) * int64_t(B_) * T_ + int64_t(b) * T_;
        } else {
            const int64_t r = (index * B_ + b) * world_ + rank_, W = windows();
            start = int64_t(starts_[permutation(r / W)[size_t(r % W)]]);
            epoch = r / W;
        }
        const size_t at = size_t(b) * T_;
        int32_t* row_lengths = lengths ? lengths + at : nullptr;
        if (aug_)
            fill_augmented_row(start, uint64_t(epoch), tokens + at, targets + at, row_lengths);
        else
            fill_row(start % int64_t(s_.size()), tokens + at, targets + at, row_lengths);
    }
}

int64_t eval_batches(const std::vector<uint64_t>& starts, int B) {
    return (int64_t(starts.size()) + B - 1) / B;
}

void fill_eval_batch(const TokenView& s, const std::vector<uint64_t>& starts, int B, int T, int64_t index,
                     int32_t* tokens, int32_t* targets) {
    const uint64_t N = s.size(), W = starts.size();
    for (int b = 0; b < B; b++) {
        int32_t* tok = tokens + size_t(b) * T;
        int32_t* tgt = targets + size_t(b) * T;
        const uint64_t w = uint64_t(index) * B + b;
        if (w >= W) {
            std::fill(tok, tok + T, 0);
            std::fill(tgt, tgt + T, -1);
            continue;
        }
        const uint64_t start = starts[w],
                       last = w + 1 < W ? starts[w + 1] : N - 1;  // scored targets: (start, last]
        bool prompt_seen = false;
        for (int t = 0; t < T; t++) {
            const uint64_t i = start + uint64_t(t), j = i + 1;
            prompt_seen = prompt_seen || (i < N && (s.flags(i) & kRecordStart));
            tok[t] = i < N ? s.id(i) : 0;
            tgt[t] = j < N && j <= last ? target_of(s, j, prompt_seen) : -1;
        }
    }
}

}  // namespace anvil
