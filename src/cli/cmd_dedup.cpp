// anvil data dedup: drop records near an earlier one, or near a held-out set (data/minhash.h).
#include <cstdio>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "data/minhash.h"
#include "data/records.h"
#include "io/fs.h"
#include "io/json_text.h"

namespace anvil::cli {

namespace {

struct DedupOpts {
    std::string in, out, report;
    std::vector<std::string> against;
    MinHashOptions mh;
};

// A file's records (data/records.h) and their shingle sets.
struct Records {
    TextRecords t;
    std::vector<std::vector<uint64_t>> sets;
};

Records read_records(const std::string& path, int ngram) {
    Records r{read_text_records(path), {}};
    for (const std::string& text : r.t.texts) r.sets.push_back(shingles(text, ngram));
    return r;
}

int run_dedup(const DedupOpts& o) {
    ANVIL_CHECK(o.in != o.out,
                "--out {}: the same file as --in; write elsewhere (the input is never replaced)", o.out);
    const Records in = read_records(o.in, o.mh.ngram);
    std::vector<Records> refs;
    for (const std::string& f : o.against) refs.push_back(read_records(f, o.mh.ngram));
    // why each record goes: "" (kept), else the report's line
    std::vector<nlohmann::json> dropped(in.t.lines.size());
    size_t near_ref = 0, near_earlier = 0;
    for (size_t k = 0; k < refs.size(); k++)
        for (const NearMatch& m : near_references(in.sets, refs[k].sets, o.mh))
            if (dropped[m.record].is_null()) {
                dropped[m.record] = {{"line", in.t.lineno[m.record]},
                                     {"reason", "near_against"},
                                     {"match", fmt::format("{}:{}", o.against[k], refs[k].t.lineno[m.match])},
                                     {"jaccard", m.jaccard}};
                near_ref++;
            }
    for (const NearMatch& m : near_duplicates(in.sets, o.mh))
        if (dropped[m.record].is_null()) {
            dropped[m.record] = {{"line", in.t.lineno[m.record]},
                                 {"reason", "near_duplicate"},
                                 {"match", fmt::format("{}:{}", o.in, in.t.lineno[m.match])},
                                 {"jaccard", m.jaccard}};
            near_earlier++;
        }
    std::string kept, report;
    size_t n_kept = 0;
    for (size_t i = 0; i < in.t.lines.size(); i++) {
        if (dropped[i].is_null()) {
            kept += in.t.lines[i] + "\n";
            n_kept++;
        } else {
            report += json_text(dropped[i]) + "\n";
        }
    }
    ANVIL_CHECK(n_kept > 0,
                "{}: every record was dropped ({} near --against, {} near an earlier one); nothing "
                "written. Check --threshold",
                o.in, near_ref, near_earlier);
    write_file_atomic(o.out, kept);
    if (!o.report.empty()) write_file_atomic(o.report, report);
    std::printf(
        "dedup: %zu records, kept %zu in %s; dropped %zu near an earlier record and %zu near --against "
        "(exact Jaccard >= %.2f of %d-word shingles, %d bands x %d rows)%s\n",
        in.t.lines.size(), n_kept, o.out.c_str(), near_earlier, near_ref, o.mh.threshold, o.mh.ngram,
        o.mh.bands, o.mh.rows,
        o.report.empty() ? "" : fmt::format("; each dropped record in {}", o.report).c_str());
    return 0;
}

}  // namespace

Command add_dedup(CLI::App* data) {
    CLI::App* sub = data->add_subcommand("dedup",
                                         "drop near-duplicate records (MinHash over word n-grams, bands x "
                                         "rows, each pair verified by its exact "
                                         "Jaccard similarity), and records near a held-out set (--against)");
    auto o = std::make_shared<DedupOpts>();
    sub->add_option("--in", o->in, "records: .jsonl (a record's text is its string fields) or one a line")
        ->required();
    sub->add_option("--out", o->out, "the kept records, as they were written in --in")->required();
    sub->add_option("--against", o->against,
                    "held-out files: drop every --in record near one of theirs (train/test leakage)");
    sub->add_option("--report", o->report,
                    "each dropped record: its line, why, the line it is near, Jaccard");
    sub->add_option("--ngram", o->mh.ngram, "words a shingle")->capture_default_str()->check(kPositive);
    sub->add_option("--bands", o->mh.bands, "LSH bands")->capture_default_str()->check(kPositive);
    sub->add_option(
           "--rows", o->mh.rows,
           "min-hashes a band; a pair of similarity s is a candidate with chance 1 - (1 - s^rows)^bands")
        ->capture_default_str()
        ->check(kPositive);
    sub->add_option("--threshold", o->mh.threshold, "drop pairs of at least this exact Jaccard similarity")
        ->capture_default_str()
        ->check(CLI::Range(0.01, 1.0));
    sub->add_option("--seed", o->mh.seed, "the hash functions' seed")->capture_default_str();
    return {sub, [o] { return run_dedup(*o); }};
}

}  // namespace anvil::cli
