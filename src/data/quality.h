// Heuristic quality rules for text records (`anvil data filter --heuristics gopher`): the document-level
// rules of DeepMind's Gopher (Rae et al. 2021, appendix A), with the thresholds datatrove's
// GopherQualityFilter defaults to. A record that breaks any rule is low quality; the rules it breaks are
// named.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace anvil {

struct GopherOptions {
    int min_words = 50, max_words = 100'000;       // words: whitespace-separated pieces
    double min_mean_word = 3, max_mean_word = 10;  // mean word length in characters (bytes)
    double max_symbol_ratio = 0.1;                 // ("#" words + "..."/"…" words) / words
    double max_bullet_lines = 0.9;                 // share of lines starting with a bullet (•, -, *)
    double max_ellipsis_lines = 0.3;               // share of lines ending with "..." or "…"
    double min_alpha_words = 0.8;                  // share of words with at least one letter
    int min_stop_words = 2;  // of "the", "be", "to", "of", "and", "that", "have", "with"
};

// The rules `text` breaks: "too_few_words", "too_many_words", "short_words", "long_words", "symbols",
// "bullets", "ellipsis", "non_alpha", "no_stop_words"; empty when it passes.
std::vector<std::string> gopher_failures(std::string_view text, const GopherOptions& o = {});

}  // namespace anvil
