// anvil data augment: each record followed by --copies augmented copies (data/augment.h: EDA's operations,
// case and whitespace noise), only the fields that do not decide the answer changed.
#include <algorithm>
#include <cstdio>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "data/augment.h"
#include "data/records.h"
#include "io/fs.h"
#include "io/json_text.h"
#include "serve/batch.h"

namespace anvil::cli {

namespace {

struct AugmentCmdOpts {
    std::string in, out, ops, fields = "instruction", synonyms;
    std::string paraphrase_prompt = "Rewrite this instruction in other words, keeping its meaning.";
    InferenceOptions paraphrase, check;  // --paraphrase-model, --check-model (device and threads shared)
    int copies = 1, batch = 16, max_new_tokens = 128;
    double p = 0.1;
    float temperature = 0.7f;
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

struct Record {
    size_t line = 0;
    std::string text;
    RawRecord raw;
};
struct Copy {
    size_t rec = 0;
    int copy = 0;
    Example ex;
    std::string op;
    uint64_t seed = 0;  // paraphrase: the sampling seed
    bool kept = true;
};

// Copies whose operation is paraphrase: each chosen field rewritten by --paraphrase-model (as an instruction
// record: --paraphrase-prompt with the field as its input); a copy none of whose fields got a finished,
// changed rewrite is dropped. Returns how many were.
size_t paraphrase(const AugmentCmdOpts& o, const std::vector<std::string>& fields,
                  std::vector<Copy*>& pending) {
    InferenceSetup l = setup_inference(o.paraphrase);
    ANVIL_CHECK(l.tok, "--paraphrase-model {}: no tokenizer, so it cannot generate; pass --tokenizer",
                o.paraphrase.model_dir);
    std::vector<Example> asks;
    std::vector<uint64_t> seeds;
    for (Copy* c : pending)
        for (std::string* f : chosen_fields(c->ex, fields)) {
            asks.push_back({o.paraphrase_prompt, *f, "", {}});
            seeds.push_back(c->seed + seeds.size());
        }
    SampleOptions s;
    s.temperature = o.temperature, s.max_new_tokens = o.max_new_tokens;
    const std::vector<serve::Answer> got =
        serve::answer_examples(*l.model, *l.tok, l.prompt, asks, s, seeds, o.batch);
    size_t k = 0, dropped = 0;
    for (Copy* c : pending) {
        bool changed = false;
        for (std::string* f : chosen_fields(c->ex, fields)) {
            const serve::Answer& a = got[k++];
            if (!a.finished || a.text.empty() || a.text == *f) continue;
            *f = a.text;
            changed = true;
        }
        c->kept = changed;
        dropped += !changed;
    }
    return dropped;
}

// --check-model: a paraphrased copy is kept only where the check model's greedy answer to it is its answer
// to the original record. Returns how many were dropped.
size_t check_answers(const AugmentCmdOpts& o, const std::vector<Record>& recs, std::vector<Copy*>& pending) {
    InferenceSetup l = setup_inference(o.check);
    ANVIL_CHECK(l.tok, "--check-model {}: no tokenizer, so it cannot answer; pass --tokenizer",
                o.check.model_dir);
    std::vector<Example> asks;
    for (Copy* c : pending)
        if (c->kept) asks.push_back(recs[c->rec].raw.ex), asks.push_back(c->ex);
    // the answers are greedy: the seeds do not matter
    SampleOptions s;
    s.temperature = 0, s.max_new_tokens = o.max_new_tokens;
    const std::vector<serve::Answer> got = serve::answer_examples(
        *l.model, *l.tok, l.prompt, asks, s, std::vector<uint64_t>(asks.size(), 0), o.batch);
    size_t k = 0, dropped = 0;
    for (Copy* c : pending) {
        if (!c->kept) continue;
        const serve::Answer &orig = got[k], &para = got[k + 1];
        k += 2;
        c->kept = orig.finished && para.finished && orig.text == para.text;
        dropped += !c->kept;
    }
    return dropped;
}

std::vector<Record> read_records(const std::string& path) {
    std::vector<Record> recs;
    read_lines(path, [&](const std::string& line, size_t lineno) {
        if (line.find_first_not_of(" \t\r") == std::string::npos) return;
        Record r{lineno, line, parse_jsonl_line(line, path, lineno, "text")};
        ANVIL_CHECK(r.raw.reject.empty(), "{} line {}: {}", path, lineno, r.raw.reject);
        recs.push_back(std::move(r));
    });
    ANVIL_CHECK(!recs.empty(), "{}: no records in it", path);
    return recs;
}

int run_augment(const AugmentCmdOpts& o) {
    ANVIL_CHECK(o.in != o.out,
                "--out {}: the same file as --in; write elsewhere (the input is never replaced)", o.out);
    std::vector<std::string> names = split_commas(o.ops);
    const bool para = std::erase(names, "paraphrase") > 0;
    ANVIL_CHECK(!para || !o.paraphrase.model_dir.empty(),
                "--ops paraphrase needs --paraphrase-model DIR (the model that rewrites)");
    ANVIL_CHECK(o.check.model_dir.empty() || para,
                "--check-model checks paraphrases; add paraphrase to --ops");
    AugmentOptions ao;
    if (!names.empty() || !para) {
        std::string text_ops;
        for (const std::string& n : names) text_ops += (text_ops.empty() ? "" : ",") + n;
        ao.ops = parse_augment_ops(text_ops, "--ops");
    }
    ao.fields = split_commas(o.fields);
    ao.p = o.p;
    if (!o.synonyms.empty()) ao.synonyms = std::make_shared<Synonyms>(Synonyms::read(o.synonyms));
    check_augment_options(ao, "--ops", "--fields");
    const std::vector<Record> recs = read_records(o.in);
    std::vector<Copy> copies;
    std::vector<Copy*> pending;  // paraphrases
    size_t plain = 0;
    for (size_t i = 0; i < recs.size(); i++) {
        if (!recs[i].raw.example) {  // a text record has no field that leaves an answer alone
            plain++;
            continue;
        }
        for (int c = 0; c < o.copies; c++) {
            Copy cp{i, c + 1, recs[i].raw.ex, "", 0, true};
            Rng rng(augmentation_seed(o.seed, uint64_t(c), i));
            const size_t k = rng.below(ao.ops.size() + (para ? 1 : 0));
            if (k == ao.ops.size()) {
                cp.op = "paraphrase", cp.seed = rng.next_u64();
            } else {
                augment_fields(cp.ex, ao.ops[k], ao, rng);
                cp.op = augment_op_name(ao.ops[k]);
            }
            copies.push_back(std::move(cp));
        }
    }
    for (Copy& c : copies)
        if (c.op == "paraphrase") pending.push_back(&c);
    const size_t unparaphrased = pending.empty() ? 0 : paraphrase(o, ao.fields, pending);
    const size_t changed_answer =
        pending.empty() || o.check.model_dir.empty() ? 0 : check_answers(o, recs, pending);
    std::string out;
    size_t n_copies = 0, unchanged = 0, next = 0;
    for (size_t i = 0; i < recs.size(); i++) {
        out += recs[i].text + "\n";
        const nlohmann::ordered_json j =
            recs[i].raw.example ? nlohmann::ordered_json::parse(recs[i].text) : nlohmann::ordered_json();
        std::vector<nlohmann::ordered_json> earlier;  // this record's copies written
        for (; next < copies.size() && copies[next].rec == i; next++) {
            const Copy& c = copies[next];
            if (!c.kept) continue;
            nlohmann::ordered_json a = with_fields(j, c.ex);
            if (a == j || std::find(earlier.begin(), earlier.end(), a) != earlier.end()) {
                unchanged++;
                continue;
            }
            earlier.push_back(a);
            a["augment"] = {{"op", c.op}, {"copy", c.copy}, {"line", recs[i].line}};
            out += json_text(a) + "\n";
            n_copies++;
        }
    }
    write_file_atomic(o.out, out);
    std::printf(
        "augment: %zu records and %zu augmented copies in %s (left out: %zu copies unchanged or repeated",
        recs.size(), n_copies, o.out.c_str(), unchanged);
    if (para)
        std::printf(
            ", %zu of %zu paraphrases not finished or not different, %zu whose answer --check-model changes",
            unparaphrased, pending.size(), changed_answer);
    std::printf("; %zu text records not augmented)\n", plain);
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
    sub->add_option("--ops", o->ops,
                    "operations, comma-separated, one drawn per copy: swap, delete, insert, synonym, case, "
                    "space, paraphrase")
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
    sub->add_option(
        "--paraphrase-model", o->paraphrase.model_dir,
        "paraphrase: the model that rewrites a field (asked --paraphrase-prompt, the field as input)");
    sub->add_option("--paraphrase-prompt", o->paraphrase_prompt, "paraphrase: the instruction it is given")
        ->capture_default_str();
    sub->add_option("--check-model", o->check.model_dir,
                    "paraphrase: keep a paraphrased copy only where this model's greedy answer to it is its "
                    "answer to the original");
    sub->add_option("--temperature", o->temperature, "paraphrase: sampling temperature")
        ->capture_default_str()
        ->check(kNonNegative);
    sub->add_option("--max-new-tokens", o->max_new_tokens,
                    "paraphrase: a rewrite's (and a checked answer's) limit")
        ->capture_default_str()
        ->check(kPositive);
    sub->add_option("--batch", o->batch, "paraphrase: sequences decoded together")
        ->capture_default_str()
        ->check(kPositive);
    sub->add_option("--device", o->paraphrase.device, "paraphrase: cpu, cuda or auto")
        ->capture_default_str()
        ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
    sub->add_option("--threads", o->paraphrase.threads, "CPU threads (0 = all cores)")->check(kNonNegative);
    sub->add_option("--seed", o->seed, "copy c of record i draws from (seed, c, i)")->capture_default_str();
    return {sub, [o] {
                o->check.device = o->paraphrase.device, o->check.threads = o->paraphrase.threads;
                return run_augment(*o);
            }};
}

}  // namespace anvil::cli
