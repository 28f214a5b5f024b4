// Per-example evaluation files and their paired comparison: `anvil eval --per-example FILE` and a run's
// eval_examples.jsonl hold one JSON line a record (index, prompt, expected, output, exact, logprob,
// answer_tokens); `anvil compare A B` pairs two of them record by record and says how sure the difference is
// with a paired bootstrap (Efron & Tibshirani; Koehn 2004 for MT, the usual test between two models scored on
// one test set).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/evaluate.h"

namespace anvil {

// The file a run directory keeps its final evaluation's records in.
inline constexpr const char* kRunExamplesFile = "eval_examples.jsonl";

std::string example_line(const ExampleResult& r);  // one JSON line, without its newline
// The other way; throws nlohmann::json's exception when the line is not such a record.
ExampleResult parse_example_line(const std::string& line);
void write_per_example(const std::string& path, const std::vector<ExampleResult>& results);  // atomically

struct PerExample {
    std::string path;  // the file read
    std::vector<ExampleResult> records;
};
// A per-example file, or a run directory's (its eval_examples.jsonl). A malformed line is an error naming the
// file and line.
PerExample read_per_example(const std::string& file_or_run_dir);

enum class CompareMetric { ExactMatch, Loss };
const char* metric_name(CompareMetric m);  // "exact_match", "loss"
// A record's value: 1/0 for an exact answer, or its answer's mean negative log-probability.
std::vector<double> metric_values(const PerExample& p, CompareMetric m);
// Throws unless both hold the same records (same count; each index's prompt and expected answer alike),
// naming the first that differs.
void check_same_records(const PerExample& a, const PerExample& b);

struct PairedComparison {
    int n = 0;
    double mean_a = 0.0, mean_b = 0.0;
    double diff = 0.0;          // mean_b - mean_a
    double lo = 0.0, hi = 0.0;  // the percentile interval of the resampled differences
    double p_value = 1.0;       // two-sided: twice the share of resampled differences on the far side of 0
    int a_higher = 0, b_higher = 0;  // records where one side's value is the larger
};
// The paired bootstrap: `resamples` draws of n records with replacement (deterministic from `seed`), the mean
// of b - a over each; the interval holds the central `level` of those means (linear interpolation between
// order statistics, numpy's default percentile).
PairedComparison paired_bootstrap(const std::vector<double>& a, const std::vector<double>& b, int resamples,
                                  uint64_t seed, double level = 0.95);

}  // namespace anvil
