// anvil data augment: each record followed by --copies augmented copies (data/augment.h: EDA's operations,
// case and whitespace noise), only the fields that do not decide the answer changed.
#include <cstdio>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "data/augment.h"
#include "data/records.h"
#include "io/fs.h"
#include "io/json_text.h"

namespace anvil::cli {

namespace {

struct AugmentCmdOpts {
    std::string in, out, ops, fields = "instruction", synonyms;
    int copies = 1;
    double p = 0.1;
    uint64_t seed = 1;
};

// The record's JSON with the augmented example's fields written back.
nlohmann::ordered_json with_fields(nlohmann::ordered_json j, const Example& e) {
    if (!e.chat()) {
        j["instruction"] = e.instruction;
        if (j.contains("input") || !e.input.empty()) j["input"] = e.input;
        return j;
    }
    for (size_t m = 0; m < e.messages.size(); m++) j["messages"][m]["content"] = e.messages[m].content;
    return j;
}

int run_augment(const AugmentCmdOpts& o) {
    ANVIL_CHECK(o.in != o.out,
                "--out {}: the same file as --in; write elsewhere (the input is never replaced)", o.out);
    AugmentOptions ao;
    ao.ops = parse_augment_ops(o.ops, "--ops");
    ao.fields = split_commas(o.fields);
    ao.p = o.p;
    if (!o.synonyms.empty()) ao.synonyms = std::make_shared<Synonyms>(Synonyms::read(o.synonyms));
    check_augment_options(ao, "--ops", "--fields");
    std::string out;
    size_t records = 0, copies = 0, unchanged = 0, plain = 0;
    read_lines(o.in, [&](const std::string& line, size_t lineno) {
        if (line.find_first_not_of(" \t\r") == std::string::npos) return;
        const RawRecord r = parse_jsonl_line(line, o.in, lineno, "text");
        ANVIL_CHECK(r.reject.empty(), "{} line {}: {}", o.in, lineno, r.reject);
        out += line + "\n";
        const size_t rec = records++;
        if (!r.example) {  // a text record has no field that leaves an answer alone
            plain++;
            return;
        }
        const nlohmann::ordered_json j = nlohmann::ordered_json::parse(line);
        for (int c = 0; c < o.copies; c++) {
            Example e = r.ex;
            Rng rng(augmentation_seed(o.seed, uint64_t(c), rec));
            const AugmentOp op = augment_example(e, ao, rng);
            nlohmann::ordered_json a = with_fields(j, e);
            if (a == j) {
                unchanged++;
                continue;
            }
            a["augment"] = {{"op", augment_op_name(op)}, {"copy", c + 1}, {"line", lineno}};
            out += json_text(a) + "\n";
            copies++;
        }
    });
    ANVIL_CHECK(records > 0, "{}: no records in it", o.in);
    write_file_atomic(o.out, out);
    std::printf(
        "augment: %zu records and %zu augmented copies in %s (%zu copies left out as unchanged, %zu text "
        "records not augmented)\n",
        records, copies, o.out.c_str(), unchanged, plain);
    return 0;
}

}  // namespace

Command add_augment(CLI::App* data) {
    CLI::App* sub = data->add_subcommand(
        "augment",
        "each record followed by --copies augmented copies: words swapped, deleted, inserted, replaced by "
        "synonyms, case and whitespace noise, in the fields that do not decide the answer");
    auto o = std::make_shared<AugmentCmdOpts>();
    sub->add_option("--in", o->in, "JSONL instruction or chat records")->required();
    sub->add_option(
           "--out", o->out,
           "every record as it was, each followed by its copies (with an \"augment\" field the trainer "
           "ignores: the operation, the copy, the line)")
        ->required();
    sub->add_option(
           "--ops", o->ops,
           "operations, comma-separated, one drawn per copy: swap, delete, insert, synonym, case, space")
        ->required();
    sub->add_option("--copies", o->copies, "augmented copies a record")
        ->capture_default_str()
        ->check(kPositive);
    sub->add_option("--p", o->p, "the share of a field's words an operation changes (EDA's alpha)")
        ->capture_default_str()
        ->check(CLI::Range(0.001, 1.0));
    sub->add_option("--fields", o->fields,
                    "fields to change, comma-separated: instruction, input, system, user (a chat's turns)")
        ->capture_default_str();
    sub->add_option(
        "--synonyms", o->synonyms,
        "a word list: one group of synonyms a line, comma-separated (synonym needs it; insert uses it)");
    sub->add_option("--seed", o->seed, "copy c of record i draws from (seed, c, i)")->capture_default_str();
    return {sub, [o] { return run_augment(*o); }};
}

}  // namespace anvil::cli
