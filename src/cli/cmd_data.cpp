// anvil data prepare: raw text/JSONL/CSV -> token shards, with a split, de-duplication, leakage check and
// a report of every record not kept.
#include <memory>

#include "cli/commands.h"
#include "data/prepare.h"

namespace anvil::cli {

Command add_data(CLI::App& app) {
    CLI::App* sub = app.add_subcommand("data", "data preparation");
    sub->require_subcommand(1);
    CLI::App* prep = sub->add_subcommand("prepare",
                                         "tokenize files into training shards, split, de-duplicate, "
                                         "check for leakage, report every rejected record");
    auto o = std::make_shared<PrepareOptions>();
    prep->add_option("--in", o->inputs, "input files: .txt (one document each), .jsonl, .csv")->required();
    prep->add_option("--out", o->out, "output directory (meta.json, shards, report.json, rejects.jsonl)")
        ->required();
    prep->add_option("--tokenizer", o->tokenizer,
                     "byte, GPT-2 BPE files, or a Hugging Face tokenizer.json (file or directory)")
        ->capture_default_str();
    prep->add_option("--format", o->format, "auto (by extension), text, jsonl or csv")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "text", "jsonl", "csv"}));
    prep->add_option("--text-field", o->text_field, "JSONL field holding plain text")->capture_default_str();
    prep->add_option("--csv-column", o->csv_column, "CSV column holding plain text")->capture_default_str();
    add_template_flag(prep, o->prompt_template, "the chosen one is recorded in meta.json")
        ->capture_default_str();
    prep->add_option("--val-fraction", o->val_fraction, "fraction of records for validation")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 0.99));
    prep->add_option("--test-fraction", o->test_fraction, "fraction of records for test")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 0.99));
    prep->add_option("--seed", o->seed, "split seed")->capture_default_str();
    prep->add_option("--dedup", o->dedup, "drop records whose content repeats an earlier one")
        ->capture_default_str();
    prep->add_flag(
        "--near-dedup", o->near_dedup,
        "drop records near an earlier kept one too: word 5-gram MinHash, verified by exact Jaccard "
        "(see anvil data dedup)");
    prep->add_option("--near-threshold", o->near_threshold, "--near-dedup's Jaccard similarity")
        ->capture_default_str()
        ->check(CLI::Range(0.01, 1.0));
    prep->add_option("--leak-ngram", o->leak_ngram,
                     "report held-out records sharing a span of this many tokens "
                     "with training (default: 13 with a BPE tokenizer, 50 with bytes; 0 = off)")
        ->check(kNonNegative);
    prep->add_flag("--strict", o->strict, "fail (write nothing) if any record is rejected or duplicated");
    prep->add_flag("--overwrite", o->overwrite, "replace --out if it exists");
    prep->add_option("--shard-tokens", o->shard_tokens, "tokens per shard file")
        ->capture_default_str()
        ->check(kPositive);
    prep->add_option("--threads", o->threads, "tokenizer threads (0 = all cores)")->check(kNonNegative);
    return {prep, [o]() { return run_prepare(*o); }};
}

}  // namespace anvil::cli
