// anvil compare: two evaluations of the same records, paired, with a bootstrap interval (runtime/compare.h).
#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "runtime/compare.h"

namespace anvil::cli {

namespace {

struct CompareOpts {
    std::string a, b, metric = "exact_match", json;
    int bootstrap = 10000;
    uint64_t seed = 0;
    double level = 0.95;
};

// The sentence under the figures: which side is better, or that the interval holds 0.
std::string verdict(const PairedComparison& r, CompareMetric m, double level) {
    const bool higher_better = m == CompareMetric::ExactMatch;
    if (r.lo <= 0.0 && r.hi >= 0.0)
        return fmt::format("no difference shown: the {:.0f}% interval holds 0", 100.0 * level);
    const bool b_better = (r.lo > 0.0) == higher_better;
    return fmt::format("{} is better: the {:.0f}% interval is {} 0", b_better ? "B" : "A", 100.0 * level,
                       r.lo > 0.0 ? "above" : "below");
}

int run_compare(const CompareOpts& o) {
    const CompareMetric m = o.metric == "loss" ? CompareMetric::Loss : CompareMetric::ExactMatch;
    const PerExample a = read_per_example(o.a), b = read_per_example(o.b);
    check_same_records(a, b);
    const PairedComparison r =
        paired_bootstrap(metric_values(a, m), metric_values(b, m), o.bootstrap, o.seed, o.level);
    // exact match in percent (differences in points), loss in nats
    const bool em = m == CompareMetric::ExactMatch;
    const double k = em ? 100.0 : 1.0;
    const auto value = [em](double x) {
        return em ? fmt::format("{:7.1f}%", 100.0 * x) : fmt::format("{:8.4f}", x);
    };
    const auto delta = [em](double x) {
        return em ? fmt::format("{:+.1f} points", 100.0 * x) : fmt::format("{:+.4f}", x);
    };
    std::string text = fmt::format(
        "{} on {} records, paired ({} bootstrap resamples, seed {})\n"
        "  A  {}  {}\n"
        "  B  {}  {}\n"
        "  B - A: {}, {:.0f}% interval [{:+.{}f}, {:+.{}f}], p = {:.3g}\n"
        "  {}\n",
        metric_name(m), r.n, o.bootstrap, o.seed, value(r.mean_a), a.path, value(r.mean_b), b.path,
        delta(r.diff), 100.0 * o.level, k * r.lo, em ? 1 : 4, k * r.hi, em ? 1 : 4, r.p_value,
        verdict(r, m, o.level));
    text += em ? fmt::format("  records right only in A: {}, only in B: {}\n", r.a_higher, r.b_higher)
               : fmt::format("  records with the lower loss in A: {}, in B: {}\n", r.b_higher, r.a_higher);
    const nlohmann::json j = {{"metric", metric_name(m)},
                              {"n", r.n},
                              {"a", {{"path", a.path}, {"mean", r.mean_a}}},
                              {"b", {{"path", b.path}, {"mean", r.mean_b}}},
                              {"diff", r.diff},
                              {"interval", {r.lo, r.hi}},
                              {"level", o.level},
                              {"p_value", r.p_value},
                              {"a_higher", r.a_higher},
                              {"b_higher", r.b_higher},
                              {"bootstrap", o.bootstrap},
                              {"seed", o.seed}};
    emit_result(o.json, j, text);
    return 0;
}

}  // namespace

Command add_compare(CLI::App& app) {
    CLI::App* sub = app.add_subcommand(
        "compare",
        "compare two evaluations of the same records (anvil eval --per-example files, or run directories) "
        "with a paired-bootstrap interval on the difference");
    auto o = std::make_shared<CompareOpts>();
    sub->add_option("A", o->a,
                    "the baseline: a per-example file, or a run directory (its eval_examples.jsonl)")
        ->required();
    sub->add_option("B", o->b, "the one compared with it, the same way")->required();
    sub->add_option("--metric", o->metric,
                    "exact_match (the share answered exactly; higher is better) or loss (the expected "
                    "answer's mean negative log-probability; lower is better)")
        ->capture_default_str()
        ->check(CLI::IsMember({"exact_match", "loss"}));
    sub->add_option("--bootstrap", o->bootstrap, "resamples of the records")
        ->capture_default_str()
        ->check(CLI::Range(100, 10000000));
    sub->add_option("--seed", o->seed, "the resampling's seed")->capture_default_str();
    sub->add_option("--level", o->level, "the interval's confidence level")
        ->capture_default_str()
        ->check(CLI::Range(0.5, 0.999));
    add_json_flag(sub, o->json);
    return {sub, [o] { return run_compare(*o); }};
}

}  // namespace anvil::cli
