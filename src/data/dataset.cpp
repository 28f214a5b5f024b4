#include "data/dataset.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/hash.h"
#include "data/records.h"
#include "io/fs.h"
#include "io/json_text.h"

namespace anvil {

uint64_t fingerprint(const TokenView& v) {
    uint64_t h = kFnvOffset;
    for (size_t i = 0; i < v.size(); i++)
        h = fnv1a_mix(fnv1a_mix(h, uint64_t(uint32_t(v.id(i)))), v.flags(i));
    return h;
}

namespace {

bool is_jsonl_path(const std::string& p) {
    return p.ends_with(".jsonl") || p.ends_with(".json");
}

// One JSONL line into a record (the parser `data prepare` uses); a rejected line is an error naming
// file:line.
RawRecord parse_record(const std::string& line, const std::string& file, size_t lineno,
                       const std::string& text_field) {
    RawRecord r = parse_jsonl_line(line, file, lineno, text_field);
    ANVIL_CHECK(r.reject.empty(), "{}:{}: {}", file, lineno, r.reject);
    return r;
}

void append_record(TokenStream& s, const RawRecord& r, const Tokenizer& tok, PromptTemplate tmpl) {
    if (r.example) {
        const std::string why = template_problem(r.ex, tmpl, tok);
        ANVIL_CHECK(why.empty(), "{}:{}: {}", r.file, r.line, why);
        const TokenStream rec = record_tokens(r.ex, tmpl, tok);
        s.ids.insert(s.ids.end(), rec.ids.begin(), rec.ids.end());
        s.flags.insert(s.flags.end(), rec.flags.begin(), rec.flags.end());
        return;
    }
    const size_t first = s.size();
    if (tok.bos_id() >= 0) s.append_one(tok.bos_id(), 0);  // never a target: nothing predicts it
    s.append(tok.encode(r.text), kInLoss);
    s.append_one(tok.eot_id(), kInLoss);
    s.flags[first] |= kRecordStart;
}

template <typename F>
void for_each_line(const std::string& content, F&& f) {
    size_t pos = 0, lineno = 0;
    while (pos < content.size()) {
        size_t nl = content.find('\n', pos);
        if (nl == std::string::npos) nl = content.size();
        lineno++;
        std::string line = content.substr(pos, nl - pos);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.find_first_not_of(" \t") != std::string::npos) f(line, lineno);
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
    std::vector<RawRecord> records;
    for_each_line(content, [&](const std::string& line, size_t lineno) {
        records.push_back(parse_record(line, path, lineno, opts.text_field));
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
            if (opts.keep_examples) d.train_examples.push_back(records[i].example ? records[i].ex : Example{});
        } else {
            append_record(st->val, records[i], tok, opts.prompt);
            if (records[i].example) d.val_examples.push_back(records[i].ex);
        }
    }
    finish(d, st);
    return d;
}

std::vector<Example> read_examples_jsonl(const std::string& path) {
    const std::string content = read_file(path);
    ANVIL_CHECK(!content.empty(), "{}: file is empty", path);
    std::vector<Example> out;
    for_each_line(content, [&](const std::string& line, size_t lineno) {
        RawRecord r = parse_record(line, path, lineno, "text");
        if (r.example) out.push_back(std::move(r.ex));
    });
    return out;
}

nlohmann::ordered_json example_json(const Example& e) {
    if (!e.chat()) return {{"instruction", e.instruction}, {"input", e.input}, {"output", e.output}};
    nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
    for (const Message& m : e.messages) msgs.push_back({{"role", role_name(m.role)}, {"content", m.content}});
    return {{"messages", std::move(msgs)}};
}

void write_examples_jsonl(const std::string& path, const std::vector<Example>& examples) {
    std::string out;
    for (const auto& e : examples) out += json_text(example_json(e)) + "\n";
    write_file_atomic(path, out);
}

}  // namespace anvil
