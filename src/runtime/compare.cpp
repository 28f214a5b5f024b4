#include "runtime/compare.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "io/fs.h"
#include "io/json_text.h"

namespace anvil {

std::string example_line(const ExampleResult& r) {
    return json_text(nlohmann::json{{"index", r.index},
                                    {"prompt", r.prompt},
                                    {"expected", r.expected},
                                    {"output", r.output},
                                    {"exact", r.exact},
                                    {"logprob", r.logprob},
                                    {"answer_tokens", r.answer_tokens}});
}

ExampleResult parse_example_line(const std::string& line) {
    const nlohmann::json j = nlohmann::json::parse(line);
    return {j.at("index").get<int>(),
            j.at("prompt").get<std::string>(),
            j.at("expected").get<std::string>(),
            j.at("output").get<std::string>(),
            j.at("exact").get<bool>(),
            j.at("logprob").get<double>(),
            j.value("answer_tokens", 0)};
}

void write_per_example(const std::string& path, const std::vector<ExampleResult>& results) {
    std::string text;
    for (const ExampleResult& r : results) text += example_line(r) + "\n";
    write_file_atomic(path, text);
}

PerExample read_per_example(const std::string& file_or_run_dir) {
    PerExample p;
    p.path = dir_exists(file_or_run_dir) ? file_or_run_dir + "/" + kRunExamplesFile : file_or_run_dir;
    ANVIL_CHECK(file_exists(p.path),
                "{}: no such {}; write one with `anvil eval --per-example FILE`, or train with held-out "
                "instruction records (a run keeps its final evaluation's records in {})",
                p.path, dir_exists(file_or_run_dir) ? "file in the run directory" : "file", kRunExamplesFile);
    read_lines(p.path, [&](const std::string& line, size_t lineno) {
        if (line.empty()) return;
        try {
            p.records.push_back(parse_example_line(line));
        } catch (const nlohmann::json::exception& e) {
            fail(
                "{} line {}: not a per-example record ({}); it needs index, prompt, expected, output, "
                "exact and logprob, as `anvil eval --per-example` writes them",
                p.path, lineno, e.what());
        }
    });
    ANVIL_CHECK(!p.records.empty(), "{}: no records in it", p.path);
    return p;
}

const char* metric_name(CompareMetric m) {
    return m == CompareMetric::ExactMatch ? "exact_match" : "loss";
}

std::vector<double> metric_values(const PerExample& p, CompareMetric m) {
    std::vector<double> v;
    for (const ExampleResult& r : p.records)
        v.push_back(m == CompareMetric::ExactMatch ? (r.exact ? 1.0 : 0.0) : -r.logprob);
    return v;
}

void check_same_records(const PerExample& a, const PerExample& b) {
    ANVIL_CHECK(a.records.size() == b.records.size(),
                "{} holds {} records and {} holds {}: compare two evaluations of the same records (the same "
                "--data and --max-examples)",
                a.path, a.records.size(), b.path, b.records.size());
    for (size_t k = 0; k < a.records.size(); k++) {
        const ExampleResult &x = a.records[k], &y = b.records[k];
        ANVIL_CHECK(x.index == y.index && x.prompt == y.prompt && x.expected == y.expected,
                    "{} and {}: record {} differs (index {} and {}{}): compare two evaluations of the same "
                    "records",
                    a.path, b.path, k + 1, x.index, y.index,
                    x.index != y.index         ? ""
                    : x.expected != y.expected ? ", another expected answer"
                                               : ", another prompt (another template or tokenizer?)");
    }
}

namespace {

// numpy.percentile's default: linear interpolation between the order statistics of sorted `v`.
double percentile(const std::vector<double>& v, double q) {
    const double pos = q * double(v.size() - 1);
    const size_t i = size_t(std::floor(pos));
    const size_t j = std::min(i + 1, v.size() - 1);
    return v[i] + (pos - double(i)) * (v[j] - v[i]);
}

}  // namespace

PairedComparison paired_bootstrap(const std::vector<double>& a, const std::vector<double>& b, int resamples,
                                  uint64_t seed, double level) {
    ANVIL_ASSERT(a.size() == b.size() && !a.empty() && resamples > 0 && level > 0.0 && level < 1.0);
    PairedComparison r;
    r.n = int(a.size());
    std::vector<double> d(a.size());
    double sa = 0.0, sb = 0.0;
    for (size_t i = 0; i < a.size(); i++) {
        d[i] = b[i] - a[i];
        sa += a[i];
        sb += b[i];
        r.a_higher += a[i] > b[i];
        r.b_higher += b[i] > a[i];
    }
    r.mean_a = sa / r.n;
    r.mean_b = sb / r.n;
    r.diff = r.mean_b - r.mean_a;
    Rng rng(seed);
    std::vector<double> means(static_cast<size_t>(resamples));
    for (double& m : means) {
        double s = 0.0;
        for (int k = 0; k < r.n; k++) s += d[size_t(rng.next_u64() % uint64_t(r.n))];
        m = s / r.n;
    }
    std::sort(means.begin(), means.end());
    r.lo = percentile(means, (1.0 - level) / 2.0);
    r.hi = percentile(means, 1.0 - (1.0 - level) / 2.0);
    // two-sided: the resampled differences on the other side of 0 from the observed one (ties count half)
    double far = 0.0;
    for (double m : means) far += (r.diff >= 0.0 ? m < 0.0 : m > 0.0) ? 1.0 : m == 0.0 ? 0.5 : 0.0;
    r.p_value = std::min(1.0, 2.0 * far / resamples);
    return r;
}

}  // namespace anvil
