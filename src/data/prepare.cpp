#include "data/prepare.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "core/hash.h"
#include "core/progress.h"
#include "data/bpe.h"
#include "data/records.h"
#include "data/shard.h"
#include "io/fs.h"
#include "io/json_text.h"

namespace anvil {

namespace {

namespace fsys = std::filesystem;

constexpr const char* kRecordUnit =
    "a JSONL line, a CSV row, or a chunk of a text file (about 1 MiB, cut where tokenization is unaffected); "
    "records_in = kept + rejected_total + duplicates_removed";

enum Split { kTrain = 0, kVal = 1, kTest = 2 };
constexpr const char* kSplitNames[] = {"train", "val", "test"};

uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
uint64_t hash_bytes(std::string_view s, uint64_t h = kFnvOffset) {
    return mix64(fnv1a(s, h));
}
uint64_t content_hash(const RawRecord& r) {
    if (!r.example) return hash_bytes(r.text);
    if (!r.ex.chat())
        return hash_bytes(r.ex.output, hash_bytes(r.ex.input, hash_bytes(r.ex.instruction) ^ 0x1f) ^ 0x1e);
    uint64_t h = 0x1d;
    for (const Message& m : r.ex.messages) h = hash_bytes(m.content, h ^ uint64_t(m.role)) ^ 0x1c;
    return h;
}
std::string where(const RawRecord& r) {
    return r.file + ":" + std::to_string(r.line);
}

// Shards of one split, rotated every `limit` tokens (at a record boundary).
struct SplitWriter {
    std::string dir, name;
    int vocab = 0;
    bool flags = false;
    uint64_t limit = 0;
    std::unique_ptr<ShardWriter> cur;
    std::vector<std::string> files;
    uint64_t tokens = 0, records = 0;  // records: input records kept (text: chunks), the report's unit

    void append(const std::vector<int32_t>& ids, const std::vector<uint8_t>& fl) {
        if (ids.empty()) return;
        if (!cur) {
            files.push_back(fmt::format("{}_{:06d}.bin", name, files.size()));
            cur = std::make_unique<ShardWriter>(dir + "/" + files.back(), vocab, flags);
        }
        cur->append(ids.data(), fl.data(), ids.size());
        tokens += ids.size();
    }
    void end_record() {  // a document ends (a JSONL/CSV record, or a text file's part in this split)
        if (!cur) return;
        cur->end_record();
        if (cur->tokens() >= limit) close();
    }
    void close() {
        if (cur) cur->close();
        cur.reset();
    }
};

struct Item {  // a record on its way to a shard
    RawRecord rec;
    Split split = kTrain;
    std::vector<int32_t> ids;
    std::vector<uint8_t> flags;
    std::vector<uint64_t> ngrams;  // content n-gram hashes (leakage check)
    bool open_text = false;        // a text chunk that does not end its document
    bool starts_record = true;     // first tokens of a record (a text document's part in a split)
};

std::vector<uint64_t> ngram_hashes(const std::vector<int32_t>& t, int n) {
    std::vector<uint64_t> out;
    if (n <= 0 || t.size() < size_t(n)) return out;
    for (size_t i = 0; i + size_t(n) <= t.size(); i++) {
        uint64_t h = 0x9e3779b97f4a7c15ull;
        for (int k = 0; k < n; k++) h = mix64(h ^ uint64_t(uint32_t(t[i + size_t(k)])));
        out.push_back(h);
    }
    return out;
}

}  // namespace

int run_prepare(const PrepareOptions& o) {
    const auto t0 = std::chrono::steady_clock::now();
    ANVIL_CHECK(!o.inputs.empty(), "give at least one input file with --in");
    ANVIL_CHECK(o.val_fraction >= 0 && o.test_fraction >= 0 && o.val_fraction + o.test_fraction < 1.0,
                "--val-fraction {} + --test-fraction {} must be below 1", o.val_fraction, o.test_fraction);
    ANVIL_CHECK(o.shard_tokens > 0, "--shard-tokens must be positive");
    for (const auto& in : o.inputs) ANVIL_CHECK(file_exists(in), "--in {}: no such file", in);
    if (dir_exists(o.out) || file_exists(o.out))
        ANVIL_CHECK(o.overwrite, "--out {}: already exists; choose another directory or pass --overwrite",
                    o.out);
    const auto tok = make_tokenizer(o.tokenizer);
    const PromptTemplate tmpl = choose_template(o.prompt_template, *tok);
    const double train_end = 1.0 - o.val_fraction - o.test_fraction, val_end = o.val_fraction;
    RecordOptions ro{parse_format(o.format), o.text_field, o.csv_column, {train_end, train_end + val_end}};
    bool any_records_format = false, any_text_format = false;
    for (const auto& in : o.inputs) {
        const bool text =
            (ro.format == InputFormat::Auto ? detect_format(in) : ro.format) == InputFormat::Text;
        any_records_format |= !text;
        any_text_format |= text;
    }
    if (any_records_format)
        std::printf("template %s for instruction and chat records (%s)\n", template_name(tmpl),
                    template_reason(o.prompt_template, tmpl, *tok).c_str());

    const std::string tmp = temp_dir_for(o.out);
    make_dirs(tmp);
    struct TmpGuard {
        std::string dir;
        bool keep = false;
        ~TmpGuard() {
            std::error_code ec;
            if (!keep) fsys::remove_all(dir, ec);
        }
    } guard{tmp};

    SplitWriter writers[3];
    for (int s = 0; s < 3; s++) {
        writers[s].dir = tmp;
        writers[s].name = kSplitNames[s];
        writers[s].vocab = tok->vocab_size();
        writers[s].flags = any_records_format;
        writers[s].limit = o.shard_tokens;
    }
    std::ofstream rejects(tmp + "/rejects.jsonl");
    std::vector<std::ofstream> examples;  // val, test instruction examples for exact match
    for (const char* n : {"val_examples.jsonl", "test_examples.jsonl"}) examples.emplace_back(tmp + "/" + n);

    std::map<std::string, int64_t> reject_counts;
    // One unit everywhere: a record is a JSONL line, a CSV row or a text chunk; in = kept + rejected +
    // duplicates.
    struct PerFile {
        int64_t in = 0, kept = 0, rejected = 0, duplicates = 0;
        uint64_t bytes_dropped = 0;
    };
    std::map<std::string, PerFile> per_file;
    std::unordered_map<uint64_t, std::string> first_seen;  // content hash -> file:line (dedup)
    std::unordered_set<uint64_t> train_content;            // exact leakage
    std::vector<uint64_t> train_ngrams;
    struct HeldOut {
        Split split;
        std::string where;
        uint64_t content;
        std::vector<uint64_t> ngrams;
    };
    std::vector<HeldOut> held_out;
    int64_t records_in = 0, duplicates = 0;
    uint64_t bytes_dropped = 0;
    const int eot = tok->eot_id();
    const auto* bpe = dynamic_cast<const BpeTokenizer*>(tok.get());
    // 13 BPE tokens (~50 characters) is the GPT-3 contamination span; with bytes, 50 is about as long
    const int ngram = o.leak_ngram >= 0 ? o.leak_ngram : (bpe ? 13 : 50);

    auto note_reject = [&](const RawRecord& r, const std::string& kind, const std::string& why) {
        if (kind == "duplicate")
            per_file[r.file].duplicates++;
        else
            reject_counts[kind]++, per_file[r.file].rejected++;
        per_file[r.file].bytes_dropped += r.bytes;
        bytes_dropped += r.bytes;
        rejects
            << json_text(nlohmann::json{
                   {"file", r.file}, {"line", r.line}, {"reason", kind}, {"detail", why}, {"bytes", r.bytes}})
            << '\n';
    };

    // Tokenize a batch in parallel, then append in input order (the output does not depend on threads).
    std::vector<Item> batch;
    size_t batch_bytes = 0;
    auto flush = [&] {
        const int nthreads = o.threads > 0 ? o.threads : omp_get_max_threads();
#pragma omp parallel for schedule(dynamic, 8) num_threads(nthreads)
        for (size_t i = 0; i < batch.size(); i++) {
            Item& it = batch[i];
            const RawRecord& r = it.rec;
            if (r.example) {
                TokenStream rec = record_tokens(r.ex, tmpl, *tok);
                it.ids = std::move(rec.ids);
                it.flags = std::move(rec.flags);
                if (ngram > 0 && r.ex.chat()) {  // within the answers (system prompts are often shared)
                    std::vector<int32_t> answers;
                    for (size_t k = 0; k < it.ids.size(); k++)
                        if (it.flags[k] & kInLoss) answers.push_back(it.ids[k]);
                    it.ngrams = ngram_hashes(answers, ngram);
                } else if (ngram > 0) {  // within the input and the output (instructions are often shared)
                    it.ngrams = ngram_hashes(tok->encode(r.ex.input), ngram);
                    const auto g = ngram_hashes(tok->encode(r.ex.output), ngram);
                    it.ngrams.insert(it.ngrams.end(), g.begin(), g.end());
                }
            } else {
                it.ids = bpe ? bpe->encode(r.text) : tok->encode(r.text);
                const bool bos = tok->bos_id() >= 0 && it.starts_record;
                if (bos) it.ids.insert(it.ids.begin(), tok->bos_id());
                if (!it.open_text) it.ids.push_back(eot);
                it.flags.assign(it.ids.size(), kInLoss);
                if (bos) it.flags[0] = 0;  // never a target
                if (ngram > 0) it.ngrams = ngram_hashes(it.ids, ngram);
            }
        }
        for (Item& it : batch) {
            SplitWriter& w = writers[it.split];
            if (!it.ids.empty() && it.starts_record) it.flags[0] |= kRecordStart;
            w.append(it.ids, it.flags);
            if (!it.open_text) w.end_record();
            w.records++;
            per_file[it.rec.file].kept++;
            const uint64_t ch = content_hash(it.rec);
            if (it.split == kTrain) {
                train_content.insert(ch);
                train_ngrams.insert(train_ngrams.end(), it.ngrams.begin(), it.ngrams.end());
            } else {
                held_out.push_back({it.split, where(it.rec), ch, std::move(it.ngrams)});
                if (it.rec.example) examples[it.split - 1] << json_text(example_json(it.rec.ex)) << '\n';
            }
        }
        batch.clear();
        batch_bytes = 0;
    };

    uint64_t total_bytes = 0, done_bytes = 0;
    for (const auto& in : o.inputs) total_bytes += fsys::file_size(in);
    Progress bar("prepare", int64_t(std::max<uint64_t>(total_bytes, 1)),
                 int64_t(std::max<uint64_t>(total_bytes / 50, 1)), "B");
    for (const auto& in : o.inputs) {
        Split text_split = kTrain;
        bool text_open = false;  // a text document is open in writers[text_split]
        double chunk_start = 0.0;
        const uint64_t base = done_bytes, size = fsys::file_size(in);
        const uint64_t to_val = uint64_t(train_end * double(size)),
                       to_test = uint64_t((train_end + val_end) * double(size));
        for_each_record(
            in, ro,
            [&](RawRecord& r) {
                records_in++;
                per_file[r.file].in++;
                if (r.reject.empty() && r.example)
                    if (std::string why = template_problem(r.ex, tmpl, *tok); !why.empty())
                        r.reject_kind = "bad_chat", r.reject = std::move(why);
                if (!r.reject.empty()) {
                    note_reject(r, r.reject_kind, r.reject);
                    if (r.chunk_end >= 0) chunk_start = r.chunk_end;
                    return;
                }
                Item it;
                if (r.chunk_end >= 0) {  // text: split by position in the file
                    const Split s =
                        r.chunk_begin < to_val ? kTrain : (r.chunk_begin < to_test ? kVal : kTest);
                    if (text_open && s != text_split) {  // close the document part in the previous split
                        writers[text_split].append({eot}, {kInLoss});
                        writers[text_split].end_record();
                    }
                    it.starts_record = !(text_open && s == text_split);
                    text_open = !r.last_chunk;
                    text_split = s;
                    chunk_start = r.chunk_end;
                    it.split = s;
                    it.open_text = !r.last_chunk;
                } else {
                    const uint64_t h = content_hash(r);
                    if (o.dedup) {
                        const auto [pos, fresh] = first_seen.emplace(h, where(r));
                        if (!fresh) {
                            duplicates++;
                            note_reject(r, "duplicate", "same content as " + pos->second);
                            return;
                        }
                    }
                    const double u = double(mix64(h ^ mix64(o.seed)) >> 11) * 0x1.0p-53;
                    it.split =
                        u < o.val_fraction ? kVal : (u < o.val_fraction + o.test_fraction ? kTest : kTrain);
                }
                batch_bytes += r.bytes;
                it.rec = std::move(r);
                batch.push_back(std::move(it));
                if (batch.size() >= 4096 || batch_bytes >= (8u << 20)) flush();
            },
            [&](uint64_t bytes) {
                bar.update(int64_t(base + bytes), fmt::format("{} records", records_in));
            });
        flush();
        done_bytes = base + fsys::file_size(in);
    }
    for (auto& w : writers) w.close();
    rejects.close();
    for (auto& e : examples) e.close();

    // Leakage: held-out records equal to, or sharing an n-gram with, the training split.
    std::sort(train_ngrams.begin(), train_ngrams.end());
    train_ngrams.erase(std::unique(train_ngrams.begin(), train_ngrams.end()), train_ngrams.end());
    nlohmann::json leaks = nlohmann::json::array();
    int64_t exact_leaks = 0, ngram_leaks = 0;
    for (const HeldOut& h : held_out) {
        const bool exact = train_content.count(h.content) > 0;
        int64_t shared = 0;
        for (uint64_t g : h.ngrams) shared += std::binary_search(train_ngrams.begin(), train_ngrams.end(), g);
        if (!exact && shared == 0) continue;
        exact_leaks += exact;
        ngram_leaks += !exact;
        leaks.push_back({{"split", kSplitNames[h.split]},
                         {"where", h.where},
                         {"exact", exact},
                         {"shared_ngrams", shared},
                         {"ngrams", h.ngrams.size()}});
    }

    int64_t rejected = 0;
    for (const auto& [k, n] : reject_counts) rejected += n;
    nlohmann::json files = nlohmann::json::object();
    for (const auto& [f, c] : per_file)
        files[f] = {{"records_in", c.in},
                    {"kept", c.kept},
                    {"rejected", c.rejected},
                    {"duplicates", c.duplicates},
                    {"bytes_dropped", c.bytes_dropped}};
    const int64_t kept = int64_t(writers[0].records + writers[1].records + writers[2].records);
    nlohmann::json report = {
        {"record", kRecordUnit},
        {"inputs", files},
        {"records_in", records_in},
        {"kept", kept},
        {"rejected", reject_counts},
        {"rejected_total", rejected},
        {"duplicates_removed", duplicates},
        {"bytes_dropped", bytes_dropped},
        {"leakage",
         {{"ngram", ngram}, {"exact", exact_leaks}, {"ngram_overlap", ngram_leaks}, {"records", leaks}}},
        {"wall_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()},
    };
    for (int s = 0; s < 3; s++)
        report["splits"][kSplitNames[s]] = {
            {"records", writers[s].records}, {"tokens", writers[s].tokens}, {"files", writers[s].files}};
    bar.finish(fmt::format("{} records in = {} kept + {} rejected + {} duplicates{}", records_in, kept,
                           rejected, duplicates,
                           bytes_dropped ? fmt::format(" ({} bytes dropped)", bytes_dropped) : ""));
    if (any_text_format)
        std::printf(
            "(a text file's records are its chunks of about 1 MiB, cut where tokenization is unaffected)\n");
    std::printf("train %llu tokens (%llu records), val %llu (%llu), test %llu (%llu)\n",
                (unsigned long long)writers[0].tokens, (unsigned long long)writers[0].records,
                (unsigned long long)writers[1].tokens, (unsigned long long)writers[1].records,
                (unsigned long long)writers[2].tokens, (unsigned long long)writers[2].records);
    for (const auto& [k, n] : reject_counts) std::printf("rejected %lld: %s\n", (long long)n, k.c_str());
    if (exact_leaks + ngram_leaks > 0)
        std::printf(
            "leakage: %lld held-out records equal a training record, %lld share a %d-token span with one "
            "(report.json lists them)\n",
            (long long)exact_leaks, (long long)ngram_leaks, ngram);

    if (o.strict && (rejected > 0 || duplicates > 0)) {
        const std::string rp = o.out + ".report.json";
        write_file_atomic(rp, json_text(report, 2) + "\n");
        fail("--strict: {} records rejected and {} duplicates (listed in {}); nothing was written to {}",
             rejected, duplicates, rp, o.out);
    }
    ANVIL_CHECK(writers[0].tokens > 0, "no training data left: {} records in, {} rejected; see the report",
                records_in, rejected);

    // The training split's fingerprint, as training computes it.
    std::vector<std::unique_ptr<Shard>> shards;
    std::vector<TokenSegment> segs;
    for (const auto& f : writers[0].files) {
        shards.push_back(std::make_unique<Shard>(tmp + "/" + f));
        segs.push_back(shards.back()->segment(eot));
    }
    const uint64_t fp = fingerprint(TokenView(segs));
    shards.clear();

    tok->save(tmp);
    nlohmann::json meta = {
        {"format", "anvil-shards"},
        {"version", 1},
        {"tokenizer", {{"kind", tok->kind()}, {"vocab_size", tok->vocab_size()}, {"eot", eot}}},
        {"template", template_name(tmpl)},
        {"seed", o.seed},
        {"fingerprint", fmt::format("{:016x}", fp)},
        {"splits", report["splits"]},
    };
    write_file_atomic(tmp + "/meta.json", json_text(meta, 2) + "\n");
    write_file_atomic(tmp + "/report.json", json_text(report, 2) + "\n");
    replace_dir(tmp, o.out);
    guard.keep = true;
    std::printf("wrote %s (report.json, rejects.jsonl, meta.json, shards)\n", o.out.c_str());
    return 0;
}

}  // namespace anvil
