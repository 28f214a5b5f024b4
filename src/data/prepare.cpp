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
#include "data/minhash.h"
#include "data/records.h"
#include "data/shard.h"
#include "io/checksum.h"
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
constexpr int kNearNgram = 5;  // --near-dedup's shingles: word 5-grams, as `anvil data dedup` defaults

// A record's words, for near-duplicate detection: its text, or every field or message of an example.
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

// One `anvil data prepare` run, in a temporary directory beside --out until it is published: records routed
// to their splits (deduplicated, rejected with a reason), tokenized in parallel batches and appended in input
// order, held-out records checked for leakage against the training split, then the report, the metadata and
// the rename.
class Preparer {
public:
    explicit Preparer(const PrepareOptions& o);
    ~Preparer() {
        std::error_code ec;
        if (!published_) fsys::remove_all(tmp_, ec);
    }
    void read(const std::string& in, Progress& bar);
    // the files closed, and the held-out records checked for leakage against the training split
    void finish_reading();
    nlohmann::json report(double wall_s) const;
    void print_summary(Progress& bar) const;
    int64_t records_in() const { return records_in_; }
    int64_t rejected() const;
    int64_t duplicates() const { return duplicates_; }
    const SplitWriter& writer(Split s) const { return writers_[s]; }
    // meta.json (with the training split's fingerprint, as training computes it), report.json, the tokenizer,
    // then the temporary directory renamed to --out
    void publish(const nlohmann::json& report);

private:
    // One unit everywhere: a record is a JSONL line, a CSV row or a text chunk; in = kept + rejected +
    // duplicates.
    struct PerFile {
        int64_t in = 0, kept = 0, rejected = 0, duplicates = 0;
        uint64_t bytes_dropped = 0;
    };
    struct HeldOut {
        Split split;
        std::string where;
        uint64_t content;
        std::vector<uint64_t> ngrams;
    };
    void note_reject(const RawRecord& r, const std::string& kind, const std::string& why);
    void tokenize(Item& it) const;
    void flush();  // the batch tokenized in parallel, then appended in input order
    void check_leakage();

    const PrepareOptions& o_;
    std::unique_ptr<Tokenizer> tok_;
    PromptTemplate tmpl_;
    RecordOptions ro_;
    double train_end_ = 0, val_end_ = 0;
    bool any_records_format_ = false, any_text_format_ = false, published_ = false;
    std::string tmp_;
    SplitWriter writers_[3];
    std::ofstream rejects_;
    std::vector<std::ofstream> examples_;  // val, test instruction examples for exact match
    std::map<std::string, int64_t> reject_counts_;
    std::map<std::string, PerFile> per_file_;
    std::unordered_map<uint64_t, std::string> first_seen_;  // content hash -> file:line (dedup)
    std::unique_ptr<NearDuplicateIndex> near_;              // --near-dedup: the kept records' shingles
    std::vector<std::string> near_where_;                   // ... and where each is
    std::unordered_set<uint64_t> train_content_;            // exact leakage
    std::vector<uint64_t> train_ngrams_;
    std::vector<HeldOut> held_out_;
    int64_t records_in_ = 0, duplicates_ = 0;
    uint64_t bytes_dropped_ = 0, done_bytes_ = 0;  // done: the inputs read so far, for the progress bar
    int eot_ = 0, ngram_ = 0;
    const BpeTokenizer* bpe_ = nullptr;
    std::vector<Item> batch_;
    size_t batch_bytes_ = 0;
    nlohmann::json leaks_ = nlohmann::json::array();
    int64_t exact_leaks_ = 0, ngram_leaks_ = 0;
};

Preparer::Preparer(const PrepareOptions& o) : o_(o), tok_(make_tokenizer(o.tokenizer)) {
    tmpl_ = choose_template(o.prompt_template, *tok_);
    if (o.near_dedup) {
        MinHashOptions mh;
        mh.ngram = kNearNgram;
        mh.threshold = o.near_threshold;
        near_ = std::make_unique<NearDuplicateIndex>(mh);
    }
    train_end_ = 1.0 - o.val_fraction - o.test_fraction, val_end_ = o.val_fraction;
    ro_ = RecordOptions{
        parse_format(o.format), o.text_field, o.csv_column, {train_end_, train_end_ + val_end_}};
    for (const auto& in : o.inputs) {
        const bool text =
            (ro_.format == InputFormat::Auto ? detect_format(in) : ro_.format) == InputFormat::Text;
        any_records_format_ |= !text;
        any_text_format_ |= text;
    }
    if (any_records_format_)
        std::printf("template %s for instruction and chat records (%s)\n", template_name(tmpl_),
                    template_reason(o.prompt_template, tmpl_, *tok_).c_str());
    tmp_ = temp_dir_for(o.out);
    make_dirs(tmp_);
    for (int s = 0; s < 3; s++) {
        writers_[s].dir = tmp_;
        writers_[s].name = kSplitNames[s];
        writers_[s].vocab = tok_->vocab_size();
        writers_[s].flags = any_records_format_;
        writers_[s].limit = o.shard_tokens;
    }
    rejects_.open(tmp_ + "/rejects.jsonl");
    for (const char* n : {"val_examples.jsonl", "test_examples.jsonl"})
        examples_.emplace_back(tmp_ + "/" + n);
    eot_ = tok_->eot_id();
    bpe_ = dynamic_cast<const BpeTokenizer*>(tok_.get());
    // 13 BPE tokens (~50 characters) is the GPT-3 contamination span; with bytes, 50 is about as long
    ngram_ = o.leak_ngram >= 0 ? o.leak_ngram : (bpe_ ? 13 : 50);
}

void Preparer::note_reject(const RawRecord& r, const std::string& kind, const std::string& why) {
    if (kind == "duplicate")
        per_file_[r.file].duplicates++;
    else
        reject_counts_[kind]++, per_file_[r.file].rejected++;
    per_file_[r.file].bytes_dropped += r.bytes;
    bytes_dropped_ += r.bytes;
    rejects_
        << json_text(nlohmann::json{
               {"file", r.file}, {"line", r.line}, {"reason", kind}, {"detail", why}, {"bytes", r.bytes}})
        << '\n';
}

void Preparer::tokenize(Item& it) const {
    const RawRecord& r = it.rec;
    if (r.example) {
        TokenStream rec = record_tokens(r.ex, tmpl_, *tok_);
        it.ids = std::move(rec.ids);
        it.flags = std::move(rec.flags);
        if (ngram_ > 0 && r.ex.chat()) {  // within the answers (system prompts are often shared)
            std::vector<int32_t> answers;
            for (size_t k = 0; k < it.ids.size(); k++)
                if (it.flags[k] & kInLoss) answers.push_back(it.ids[k]);
            it.ngrams = ngram_hashes(answers, ngram_);
        } else if (ngram_ > 0) {  // within the input and the output (instructions are often shared)
            it.ngrams = ngram_hashes(tok_->encode(r.ex.input), ngram_);
            const auto g = ngram_hashes(tok_->encode(r.ex.output), ngram_);
            it.ngrams.insert(it.ngrams.end(), g.begin(), g.end());
        }
        return;
    }
    it.ids = bpe_ ? bpe_->encode(r.text) : tok_->encode(r.text);
    const bool bos = tok_->bos_id() >= 0 && it.starts_record;
    if (bos) it.ids.insert(it.ids.begin(), tok_->bos_id());
    if (!it.open_text) it.ids.push_back(eot_);
    it.flags.assign(it.ids.size(), kInLoss);
    if (bos) it.flags[0] = 0;  // never a target
    if (ngram_ > 0) it.ngrams = ngram_hashes(it.ids, ngram_);
}

// Tokenize a batch in parallel, then append in input order (the output does not depend on threads).
void Preparer::flush() {
    const int nthreads = o_.threads > 0 ? o_.threads : omp_get_max_threads();
#pragma omp parallel for schedule(dynamic, 8) num_threads(nthreads)
    for (size_t i = 0; i < batch_.size(); i++) tokenize(batch_[i]);
    for (Item& it : batch_) {
        SplitWriter& w = writers_[it.split];
        if (!it.ids.empty() && it.starts_record) it.flags[0] |= kRecordStart;
        w.append(it.ids, it.flags);
        if (!it.open_text) w.end_record();
        w.records++;
        per_file_[it.rec.file].kept++;
        const uint64_t ch = content_hash(it.rec);
        if (it.split == kTrain) {
            train_content_.insert(ch);
            train_ngrams_.insert(train_ngrams_.end(), it.ngrams.begin(), it.ngrams.end());
        } else {
            held_out_.push_back({it.split, where(it.rec), ch, std::move(it.ngrams)});
            if (it.rec.example) examples_[it.split - 1] << json_text(example_json(it.rec.ex)) << '\n';
        }
    }
    batch_.clear();
    batch_bytes_ = 0;
}

// One input's records, each rejected, or routed to its split (a text file's chunks by position in the file,
// a record by a seeded hash of its content) and batched.
void Preparer::read(const std::string& in, Progress& bar) {
    Split text_split = kTrain;
    bool text_open = false;  // a text document is open in writers_[text_split]
    const uint64_t base = done_bytes_, size = fsys::file_size(in);
    const uint64_t to_val = uint64_t(train_end_ * double(size)),
                   to_test = uint64_t((train_end_ + val_end_) * double(size));
    const auto route = [&](RawRecord& r) {
        records_in_++;
        per_file_[r.file].in++;
        if (r.reject.empty() && r.example)
            if (std::string why = template_problem(r.ex, tmpl_, *tok_); !why.empty())
                r.reject_kind = "bad_chat", r.reject = std::move(why);
        if (!r.reject.empty()) return note_reject(r, r.reject_kind, r.reject);
        Item it;
        if (r.chunk_end >= 0) {  // text: split by position in the file
            const Split s = r.chunk_begin < to_val ? kTrain : (r.chunk_begin < to_test ? kVal : kTest);
            if (text_open && s != text_split) {  // close the document part in the previous split
                writers_[text_split].append({eot_}, {kInLoss});
                writers_[text_split].end_record();
            }
            it.starts_record = !(text_open && s == text_split);
            text_open = !r.last_chunk;
            text_split = s;
            it.split = s;
            it.open_text = !r.last_chunk;
        } else {
            const uint64_t h = content_hash(r);
            if (o_.dedup) {
                const auto [pos, fresh] = first_seen_.emplace(h, where(r));
                if (!fresh) {
                    duplicates_++;
                    return note_reject(r, "duplicate", "same content as " + pos->second);
                }
            }
            if (near_) {
                NearMatch m{};
                if (near_->near_or_keep(shingles(record_text(r), kNearNgram), m))
                    return note_reject(
                        r, "near_duplicate",
                        fmt::format("Jaccard {:.3f} with {}", m.jaccard, near_where_[m.match]));
                near_where_.push_back(where(r));
            }
            const double u = double(mix64(h ^ mix64(o_.seed)) >> 11) * 0x1.0p-53;
            it.split = u < o_.val_fraction ? kVal : (u < o_.val_fraction + o_.test_fraction ? kTest : kTrain);
        }
        batch_bytes_ += r.bytes;
        it.rec = std::move(r);
        batch_.push_back(std::move(it));
        if (batch_.size() >= 4096 || batch_bytes_ >= (8u << 20)) flush();
    };
    for_each_record(in, ro_, route, [&](uint64_t bytes) {
        bar.update(int64_t(base + bytes), fmt::format("{} records", records_in_));
    });
    flush();
    done_bytes_ = base + size;
}

void Preparer::finish_reading() {
    for (auto& w : writers_) w.close();
    rejects_.close();
    for (auto& e : examples_) e.close();
    check_leakage();
}

int64_t Preparer::rejected() const {
    int64_t n = 0;
    for (const auto& [k, c] : reject_counts_) n += c;
    return n;
}

// Held-out records equal to, or sharing an n-gram with, the training split.
void Preparer::check_leakage() {
    std::sort(train_ngrams_.begin(), train_ngrams_.end());
    train_ngrams_.erase(std::unique(train_ngrams_.begin(), train_ngrams_.end()), train_ngrams_.end());
    for (const HeldOut& h : held_out_) {
        const bool exact = train_content_.count(h.content) > 0;
        int64_t shared = 0;
        for (uint64_t g : h.ngrams)
            shared += std::binary_search(train_ngrams_.begin(), train_ngrams_.end(), g);
        if (!exact && shared == 0) continue;
        exact_leaks_ += exact;
        ngram_leaks_ += !exact;
        leaks_.push_back({{"split", kSplitNames[h.split]},
                          {"where", h.where},
                          {"exact", exact},
                          {"shared_ngrams", shared},
                          {"ngrams", h.ngrams.size()}});
    }
}

nlohmann::json Preparer::report(double wall_s) const {
    nlohmann::json files = nlohmann::json::object();
    for (const auto& [f, c] : per_file_)
        files[f] = {{"records_in", c.in},
                    {"kept", c.kept},
                    {"rejected", c.rejected},
                    {"duplicates", c.duplicates},
                    {"bytes_dropped", c.bytes_dropped}};
    nlohmann::json report = {
        {"record", kRecordUnit},
        {"inputs", files},
        {"records_in", records_in_},
        {"kept", int64_t(writers_[0].records + writers_[1].records + writers_[2].records)},
        {"rejected", reject_counts_},
        {"rejected_total", rejected()},
        {"duplicates_removed", duplicates_},
        {"bytes_dropped", bytes_dropped_},
        {"leakage",
         {{"ngram", ngram_}, {"exact", exact_leaks_}, {"ngram_overlap", ngram_leaks_}, {"records", leaks_}}},
        {"wall_s", wall_s},
    };
    for (int s = 0; s < 3; s++)
        report["splits"][kSplitNames[s]] = {
            {"records", writers_[s].records}, {"tokens", writers_[s].tokens}, {"files", writers_[s].files}};
    return report;
}

void Preparer::print_summary(Progress& bar) const {
    const int64_t kept = int64_t(writers_[0].records + writers_[1].records + writers_[2].records);
    bar.finish(fmt::format("{} records in = {} kept + {} rejected + {} duplicates{}", records_in_, kept,
                           rejected(), duplicates_,
                           bytes_dropped_ ? fmt::format(" ({} bytes dropped)", bytes_dropped_) : ""));
    if (any_text_format_)
        std::printf(
            "(a text file's records are its chunks of about 1 MiB, cut where tokenization is unaffected)\n");
    std::printf("train %llu tokens (%llu records), val %llu (%llu), test %llu (%llu)\n",
                (unsigned long long)writers_[0].tokens, (unsigned long long)writers_[0].records,
                (unsigned long long)writers_[1].tokens, (unsigned long long)writers_[1].records,
                (unsigned long long)writers_[2].tokens, (unsigned long long)writers_[2].records);
    for (const auto& [k, n] : reject_counts_) std::printf("rejected %lld: %s\n", (long long)n, k.c_str());
    if (exact_leaks_ + ngram_leaks_ > 0)
        std::printf(
            "leakage: %lld held-out records equal a training record, %lld share a %d-token span with one "
            "(report.json lists them)\n",
            (long long)exact_leaks_, (long long)ngram_leaks_, ngram_);
}

void Preparer::publish(const nlohmann::json& report) {
    std::vector<std::unique_ptr<Shard>> shards;
    std::vector<TokenSegment> segs;
    for (const auto& f : writers_[0].files) {
        shards.push_back(std::make_unique<Shard>(tmp_ + "/" + f));
        segs.push_back(shards.back()->segment(eot_));
    }
    const uint64_t fp = fingerprint(TokenView(segs));
    shards.clear();
    tok_->save(tmp_);
    nlohmann::json meta = {
        {"format", "anvil-shards"},
        {"version", 1},
        {"tokenizer", {{"kind", tok_->kind()}, {"vocab_size", tok_->vocab_size()}, {"eot", eot_}}},
        {"template", template_name(tmpl_)},
        {"seed", o_.seed},
        {"fingerprint", fmt::format("{:016x}", fp)},
        {"splits", report["splits"]},
    };
    std::vector<std::string> shard_files;  // the manifest: every shard's size and CRC-32, checked when opened
    for (const auto& [split, info] : report["splits"].items())
        for (const auto& f : info["files"]) shard_files.push_back(f.get<std::string>());
    meta["files"] = file_manifest(tmp_, shard_files);
    write_file_atomic(tmp_ + "/meta.json", json_text(meta, 2) + "\n");
    write_file_atomic(tmp_ + "/report.json", json_text(report, 2) + "\n");
    replace_dir(tmp_, o_.out);
    published_ = true;
}

void check_prepare_options(const PrepareOptions& o) {
    ANVIL_CHECK(!o.inputs.empty(), "give at least one input file with --in");
    ANVIL_CHECK(o.val_fraction >= 0 && o.test_fraction >= 0 && o.val_fraction + o.test_fraction < 1.0,
                "--val-fraction {} + --test-fraction {} must be below 1", o.val_fraction, o.test_fraction);
    ANVIL_CHECK(o.shard_tokens > 0, "--shard-tokens must be positive");
    for (const auto& in : o.inputs) ANVIL_CHECK(file_exists(in), "--in {}: no such file", in);
    if (dir_exists(o.out) || file_exists(o.out))
        ANVIL_CHECK(o.overwrite, "--out {}: already exists; choose another directory or pass --overwrite",
                    o.out);
}

}  // namespace

int run_prepare(const PrepareOptions& o) {
    const auto t0 = std::chrono::steady_clock::now();
    check_prepare_options(o);
    Preparer p(o);
    uint64_t total_bytes = 0;
    for (const auto& in : o.inputs) total_bytes += fsys::file_size(in);
    Progress bar("prepare", int64_t(std::max<uint64_t>(total_bytes, 1)),
                 int64_t(std::max<uint64_t>(total_bytes / 50, 1)), "B");
    for (const auto& in : o.inputs) p.read(in, bar);
    p.finish_reading();
    const nlohmann::json report =
        p.report(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    p.print_summary(bar);
    if (o.strict && (p.rejected() > 0 || p.duplicates() > 0)) {
        const std::string rp = o.out + ".report.json";
        write_file_atomic(rp, json_text(report, 2) + "\n");
        fail("--strict: {} records rejected and {} duplicates (listed in {}); nothing was written to {}",
             p.rejected(), p.duplicates(), rp, o.out);
    }
    ANVIL_CHECK(p.writer(kTrain).tokens > 0,
                "no training data left: {} records in, {} rejected; see the report", p.records_in(),
                p.rejected());
    p.publish(report);
    std::printf("wrote %s (report.json, rejects.jsonl, meta.json, shards)\n", o.out.c_str());
    return 0;
}

}  // namespace anvil
