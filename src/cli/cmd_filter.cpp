// anvil data filter: per-record quality scores (perplexity under a reference model, as CCNet does it, and the
// Gopher rules, data/quality.h), the records inside the kept perplexity quantiles that break no rule written
// as they were, every record's scores in a file.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/progress.h"
#include "data/quality.h"
#include "data/records.h"
#include "io/fs.h"
#include "io/json_text.h"
#include "runtime/evaluate.h"

namespace anvil::cli {

namespace {

struct FilterOpts {
    std::string in, out, scores, heuristics = "none", quantiles;
    InferenceOptions ppl;  // --ppl-model
    int batch = 8;
    GopherOptions gopher;
};

// --keep-quantiles LO,HI: 0 <= LO < HI <= 1
std::pair<double, double> parse_quantiles(const std::string& s) {
    double lo = 0, hi = 1;
    char comma = 0;
    const int got = std::sscanf(s.c_str(), "%lf%c%lf", &lo, &comma, &hi);
    ANVIL_CHECK(
        got == 3 && comma == ',' && lo >= 0 && lo < hi && hi <= 1,
        "--keep-quantiles {}: give LO,HI with 0 <= LO < HI <= 1 (0,0.9 keeps the 90% of lowest perplexity)",
        s);
    return {lo, hi};
}

// The value at quantile q of sorted values (linear interpolation between the two nearest ranks).
double quantile(const std::vector<double>& sorted, double q) {
    const double at = q * double(sorted.size() - 1);
    const size_t i = size_t(std::floor(at));
    if (i + 1 >= sorted.size()) return sorted.back();
    return sorted[i] + (at - double(i)) * (sorted[i + 1] - sorted[i]);
}

int run_filter(const FilterOpts& o) {
    ANVIL_CHECK(o.in != o.out,
                "--out {}: the same file as --in; write elsewhere (the input is never replaced)", o.out);
    ANVIL_CHECK(o.heuristics == "gopher" || o.heuristics == "none", "--heuristics {}: use gopher or none",
                o.heuristics);
    ANVIL_CHECK(o.quantiles.empty() || !o.ppl.model_dir.empty(),
                "--keep-quantiles needs --ppl-model (the reference model whose perplexity it bounds)");
    const auto [q_lo, q_hi] = o.quantiles.empty() ? std::pair{0.0, 1.0} : parse_quantiles(o.quantiles);
    const TextRecords in = read_text_records(o.in);
    const size_t n = in.lines.size();
    std::vector<double> ppl(n, std::nan(""));
    if (!o.ppl.model_dir.empty()) {
        InferenceSetup l = setup_inference(o.ppl);
        ANVIL_CHECK(l.tok, "--ppl-model {}: no tokenizer, so it cannot score text; pass --tokenizer",
                    o.ppl.model_dir);
        l.model->reserve(o.batch, l.model->config().n_ctx, false);
        Progress bar("filter: perplexity", int64_t(n), std::max<int64_t>(1, int64_t(n) / 20), "records");
        const std::vector<TextScore> sc =
            score_texts(*l.model, *l.tok, in.texts, [&](int done) { bar.update(done, ""); });
        bar.finish("");
        for (size_t i = 0; i < n; i++) ppl[i] = sc[i].perplexity();
    }
    double lo = 0, hi = INFINITY;
    if (!o.ppl.model_dir.empty()) {
        std::vector<double> sorted(ppl);
        std::sort(sorted.begin(), sorted.end());
        lo = q_lo > 0 ? quantile(sorted, q_lo) : 0.0;
        hi = q_hi < 1 ? quantile(sorted, q_hi) : INFINITY;
    }
    std::string kept, scores;
    size_t n_kept = 0, n_ppl = 0, n_rules = 0;
    std::map<std::string, size_t> by_rule;
    for (size_t i = 0; i < n; i++) {
        const std::vector<std::string> broken =
            o.heuristics == "gopher" ? gopher_failures(in.texts[i], o.gopher) : std::vector<std::string>{};
        const bool ppl_out = !std::isnan(ppl[i]) && (ppl[i] < lo || ppl[i] > hi);
        const bool keep = broken.empty() && !ppl_out;
        n_ppl += ppl_out;
        n_rules += !broken.empty();
        for (const std::string& b : broken) by_rule[b]++;
        nlohmann::ordered_json s = {{"line", in.lineno[i]}, {"kept", keep}};
        if (!std::isnan(ppl[i])) s["perplexity"] = ppl[i];
        if (o.heuristics == "gopher") s["gopher"] = broken;
        scores += json_text(s) + "\n";
        if (keep) {
            kept += in.lines[i] + "\n";
            n_kept++;
        }
    }
    std::string rules;
    for (const auto& [k, v] : by_rule) rules += fmt::format("{}{} {}", rules.empty() ? "" : ", ", v, k);
    std::string counts = o.heuristics == "gopher" ? fmt::format("{} breaking a Gopher rule{}", n_rules,
                                                                rules.empty() ? "" : " (" + rules + ")")
                                                  : "";
    if (!o.ppl.model_dir.empty())
        counts = fmt::format("{} outside the perplexity quantiles [{:.4g}, {:.4g}]{}", n_ppl, lo, hi,
                             counts.empty() ? "" : ", " + counts);
    if (counts.empty()) counts = "none (no --ppl-model, no --heuristics)";
    ANVIL_CHECK(n_kept > 0, "filter: no record kept of {} ({}); nothing written", n, counts);
    write_file_atomic(o.out, kept);
    if (!o.scores.empty()) write_file_atomic(o.scores, scores);
    std::printf("filter: %zu records, kept %zu (%.1f%%) in %s; dropped %s%s\n", n, n_kept,
                100.0 * double(n_kept) / double(n), o.out.c_str(), counts.c_str(),
                o.scores.empty() ? "" : fmt::format("; every record's scores in {}", o.scores).c_str());
    return 0;
}

}  // namespace

Command add_filter(CLI::App* data) {
    CLI::App* sub = data->add_subcommand(
        "filter",
        "keep records of plausible quality: perplexity under a reference model within quantiles (CCNet) and "
        "the Gopher rules; every record's scores in a file");
    auto o = std::make_shared<FilterOpts>();
    sub->add_option("--in", o->in,
                    "records: .jsonl (a record's text is its \"text\", else its string fields) or "
                    "one a line")
        ->required();
    sub->add_option("--out", o->out, "the kept records, as they were written in --in")->required();
    sub->add_option("--ppl-model", o->ppl.model_dir, "the reference model scoring each record's perplexity");
    sub->add_option("--tokenizer", o->ppl.tokenizer, "override the reference model's tokenizer");
    sub->add_option(
        "--keep-quantiles", o->quantiles,
        "LO,HI: keep records whose perplexity lies between these quantiles of all records' (0,0.9 "
        "drops the 10% least likely)");
    sub->add_option("--heuristics", o->heuristics, "gopher: drop records breaking a Gopher rule; none")
        ->capture_default_str();
    sub->add_option("--min-words", o->gopher.min_words, "Gopher: fewest words a record")
        ->capture_default_str();
    sub->add_option("--max-words", o->gopher.max_words, "Gopher: most words a record")->capture_default_str();
    sub->add_option("--scores", o->scores,
                    "every record's scores: its line, perplexity, the Gopher rules it breaks, kept or not");
    sub->add_option("--device", o->ppl.device, "cpu, cuda or auto")
        ->capture_default_str()
        ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
    sub->add_option("--threads", o->ppl.threads, "CPU threads (0 = all cores)")->check(kNonNegative);
    sub->add_option("--batch", o->batch, "records scored together")->capture_default_str()->check(kPositive);
    return {sub, [o] { return run_filter(*o); }};
}

}  // namespace anvil::cli
