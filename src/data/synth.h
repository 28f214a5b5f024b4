// Synthetic instructions (`anvil data synth`), the parts that are plain data: Self-Instruct's prompt and its
// draw of example tasks, ROUGE-L, and the filter a generated question passes before it is answered and kept
// (length bounds, leakage into a held-out set, exact and near duplicates, ROUGE-L novelty). Sampling is the
// command's (cli/cmd_synth.cpp, on the serving scheduler).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/rng.h"
#include "data/minhash.h"

namespace anvil {

// ROUGE-L (Lin 2004) as Self-Instruct measures novelty with it (rouge_score's defaults, no stemming): a
// text's words are its runs of ASCII letters and digits, lowercased (bytes past ASCII count as letters, so
// other scripts make words too); the score is the F-measure of their longest common subsequence,
// 2 LCS / (|a| + |b|), 0 where either has no word.
std::vector<std::string> rouge_words(std::string_view text);
double rouge_l(const std::vector<std::string>& a, const std::vector<std::string>& b);

// Self-Instruct's instruction-generation prompt (Wang et al. 2023): "Come up with a series of tasks:", the
// tasks numbered one a line ("Task 1: ..."), then "Task {n+1}:"; the model's line is a new task.
std::string self_instruct_prompt(const std::vector<std::string>& tasks);
// The tasks a prompt shows: `n` distinct ones in random order, up to `from_generated` of them from the
// generated pool and the rest from the seeds (the paper: 6 seed tasks and 2 generated).
std::vector<std::string> draw_tasks(const std::vector<std::string>& seeds,
                                    const std::vector<std::string>& generated, int n, int from_generated,
                                    Rng& rng);

// Why a generated question is dropped, or kept; the first of the filter's tests it fails, in this order
// (unfinished and no_answer are the command's: the question or its answer not ended within its token limit;
// malformed: invalid UTF-8 or a control character other than tab and newline).
enum class SynthReason : uint8_t {
    Kept,
    Unfinished,
    Malformed,
    Length,
    Leak,
    Duplicate,
    Similar,
    NearDuplicate,
    NoAnswer
};
constexpr size_t kSynthReasons = 9;
const char* synth_reason_name(SynthReason r);  // "kept", "unfinished", "malformed", "length", "leak", ...
// Whether a generated text can be a record's field: valid UTF-8 without control characters but tab and
// newline.
bool well_formed(std::string_view text);

struct SynthFilterOptions {
    int min_words = 3, max_words = 150;  // the question's whitespace-separated words
    double max_rouge = 0.7;  // ROUGE-L with a kept or seed question (similar), a held-out one (leak)
    MinHashOptions near{3, 20, 5, 0.8, 0};  // near duplicates: 3-word shingles, verified Jaccard
};
struct SynthVerdict {
    SynthReason reason = SynthReason::Kept;
    std::string match;  // what it is too close to: "seed 3" (--seed-file's line), "attempt 12", "FILE:LINE"
    double score = 0;   // ROUGE-L, or Jaccard for a near duplicate
};

class SynthFilter {
public:
    explicit SynthFilter(const SynthFilterOptions& o);
    ~SynthFilter();
    // A seed counts as kept (Self-Instruct's pool starts there); `line` is its line in its file.
    void add_seed(const std::string& question, size_t line);
    void add_held_out(const std::string& question, std::string where);
    // Malformed, length, then leak (the same words as, ROUGE-L at least max_rouge with, or near a held-out
    // question), duplicate (the same words as a kept one), similar (ROUGE-L), near duplicate.
    SynthVerdict check(const std::string& question) const;
    // Counts `question` as kept from now on; `label` names it in later verdicts ("attempt 7").
    void keep(const std::string& question, std::string label);

private:
    SynthFilterOptions o_;
    struct Pool;
    std::unique_ptr<Pool> kept_, held_;
};

}  // namespace anvil
