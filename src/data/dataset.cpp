#include "data/dataset.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/fs.h"
#include "io/json_text.h"

namespace anvil {

PromptTemplate parse_template(const std::string& name) {
    if (name == "alpaca") return PromptTemplate::Alpaca;
    if (name == "compact") return PromptTemplate::Compact;
    fail("--template {}: unknown prompt template; use alpaca or compact", name);
}

const char* template_name(PromptTemplate t) {
    return t == PromptTemplate::Alpaca ? "alpaca" : "compact";
}

std::string render_prompt(const Example& e, PromptTemplate t) {
    if (t == PromptTemplate::Compact) {
        std::string p = e.instruction + "\n";
        if (!e.input.empty()) p += e.input + "\n";
        return p + "=> ";
    }
    if (e.input.empty())
        return "Below is an instruction that describes a task. Write a response that appropriately completes "
               "the request.\n\n### Instruction:\n" +
               e.instruction + "\n\n### Response:\n";
    return "Below is an instruction that describes a task, paired with an input that provides further "
           "context. "
           "Write a response that appropriately completes the request.\n\n### Instruction:\n" +
           e.instruction + "\n\n### Input:\n" + e.input + "\n\n### Response:\n";
}

void TokenStream::append(const std::vector<int32_t>& t, uint8_t flag) {
    ids.insert(ids.end(), t.begin(), t.end());
    flags.insert(flags.end(), t.size(), flag);
}

void TokenStream::append_one(int32_t id, uint8_t flag) {
    ids.push_back(id);
    flags.push_back(flag);
}

uint64_t fingerprint(const TokenView& v) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < v.size(); i++) {
        h = (h ^ uint64_t(uint32_t(v.id(i)))) * 1099511628211ull;
        h = (h ^ v.flags(i)) * 1099511628211ull;
    }
    return h;
}

namespace {

bool is_jsonl_path(const std::string& p) {
    return p.ends_with(".jsonl") || p.ends_with(".json");
}

struct Record {
    bool instruction = false;
    Example ex;
    std::string text;
};

// One JSONL line into a record; errors carry file:line.
Record parse_record(const std::string& line, const std::string& where, const std::string& text_field) {
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
        fail("{}: invalid JSON ({}); fix or remove the line", where, e.what());
    }
    ANVIL_CHECK(j.is_object(), "{}: each line must be a JSON object", where);
    Record r;
    if (j.contains("instruction") || j.contains("output")) {
        for (const char* k : {"instruction", "output"})
            ANVIL_CHECK(j.contains(k) && j[k].is_string(),
                        "{}: instruction record without a string \"{}\" field", where, k);
        ANVIL_CHECK(!j.contains("input") || j["input"].is_string() || j["input"].is_null(),
                    "{}: \"input\" must be a string", where);
        r.instruction = true;
        r.ex.instruction = j["instruction"].get<std::string>();
        r.ex.output = j["output"].get<std::string>();
        if (j.contains("input") && j["input"].is_string()) r.ex.input = j["input"].get<std::string>();
        ANVIL_CHECK(!r.ex.output.empty(), "{}: empty \"output\"; nothing to learn from this record", where);
        return r;
    }
    ANVIL_CHECK(j.contains(text_field),
                "{}: record has neither a \"{}\" field nor the instruction schema "
                "{{\"instruction\", \"input\", \"output\"}}; pick the text field with --text-field",
                where, text_field);
    ANVIL_CHECK(j[text_field].is_string(), "{}: field \"{}\" must be a string", where, text_field);
    r.text = j[text_field].get<std::string>();
    ANVIL_CHECK(!r.text.empty(), "{}: field \"{}\" is empty", where, text_field);
    return r;
}

void append_record(TokenStream& s, const Record& r, const Tokenizer& tok, PromptTemplate tmpl) {
    const size_t first = s.size();
    uint8_t out_flag = kInLoss;
    if (tok.bos_id() >= 0) s.append_one(tok.bos_id(), 0);  // never a target: nothing predicts it
    if (r.instruction) {
        s.append(tok.encode(render_prompt(r.ex, tmpl)), 0);
        out_flag = kInLoss | kNeedsPrompt;
        s.append(tok.encode(r.ex.output), out_flag);
    } else {
        s.append(tok.encode(r.text), kInLoss);
    }
    s.append_one(tok.eot_id(), out_flag);
    s.flags[first] |= kRecordStart;
}

template <typename F>
void for_each_line(const std::string& path, const std::string& content, F&& f) {
    size_t pos = 0, lineno = 0;
    while (pos < content.size()) {
        size_t nl = content.find('\n', pos);
        if (nl == std::string::npos) nl = content.size();
        lineno++;
        std::string line = content.substr(pos, nl - pos);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.find_first_not_of(" \t") != std::string::npos) f(line, path + ":" + std::to_string(lineno));
        pos = nl + 1;
    }
}

}  // namespace

namespace {
struct Streams {
    TokenStream train, val;
};
void finish(Dataset& d, std::shared_ptr<Streams> st) {
    d.train = st->train.view();
    d.val = st->val.view();
    d.fingerprint = fingerprint(d.train);
    d.storage = std::move(st);
}
}  // namespace

Dataset load_dataset(const std::string& path, const Tokenizer& tok, const DataOptions& opts) {
    ANVIL_CHECK(opts.val_fraction >= 0.0 && opts.val_fraction < 1.0, "--val-fraction {} must be in [0, 1)",
                opts.val_fraction);
    Dataset d;
    d.path = path;
    auto st = std::make_shared<Streams>();
    const std::string content = read_file(path);
    ANVIL_CHECK(!content.empty(), "{}: file is empty; give a text file or a JSONL file of records", path);
    if (!is_jsonl_path(path)) {
        const std::vector<int32_t> all = tok.encode(content);
        const size_t n_val = size_t(std::floor(double(all.size()) * opts.val_fraction));
        const size_t n_train = all.size() - n_val;
        st->train.append({all.begin(), all.begin() + long(n_train)}, kInLoss);
        st->val.append({all.begin() + long(n_train), all.end()}, kInLoss);
        if (st->train.size()) st->train.flags[0] |= kRecordStart;
        if (st->val.size()) st->val.flags[0] |= kRecordStart;
        d.records = 1;
        finish(d, st);
        return d;
    }
    d.jsonl = true;
    std::vector<Record> records;
    for_each_line(path, content, [&](const std::string& line, const std::string& where) {
        records.push_back(parse_record(line, where, opts.text_field));
    });
    ANVIL_CHECK(!records.empty(), "{}: no records (only blank lines)", path);
    d.records = records.size();
    size_t n_val = size_t(std::llround(double(records.size()) * opts.val_fraction));
    if (opts.val_fraction > 0.0 && n_val == 0 && records.size() >= 2) n_val = 1;
    if (n_val >= records.size()) n_val = records.size() - 1;
    d.val_records = n_val;
    const size_t n_train = records.size() - n_val;
    for (size_t i = 0; i < records.size(); i++) {
        if (i < n_train) {
            append_record(st->train, records[i], tok, opts.prompt);
        } else {
            append_record(st->val, records[i], tok, opts.prompt);
            if (records[i].instruction) d.val_examples.push_back(records[i].ex);
        }
    }
    finish(d, st);
    return d;
}

std::vector<Example> read_instruction_jsonl(const std::string& path) {
    const std::string content = read_file(path);
    ANVIL_CHECK(!content.empty(), "{}: file is empty", path);
    std::vector<Example> out;
    for_each_line(path, content, [&](const std::string& line, const std::string& where) {
        Record r = parse_record(line, where, "text");
        if (r.instruction) out.push_back(std::move(r.ex));
    });
    return out;
}

void write_instruction_jsonl(const std::string& path, const std::vector<Example>& examples) {
    std::string out;
    for (const auto& e : examples) {
        const nlohmann::ordered_json j = {
            {"instruction", e.instruction}, {"input", e.input}, {"output", e.output}};
        out += json_text(j) + "\n";
    }
    write_file_atomic(path, out);
}

}  // namespace anvil
