// Tokenizer, data loading and the documented batch order.
#include <filesystem>
#include <fstream>
#include <set>

#include "data/batcher.h"
#include "data/dataset.h"
#include "data/llmc.h"
#include "data/synthetic.h"
#include "harness.h"

namespace anvil::test {
namespace {

namespace fsys = std::filesystem;

std::string write_tmp(const std::string& name, const std::string& content) {
    const std::string p =
        (fsys::temp_directory_path() / ("anvil_data_" + std::to_string(::getpid()) + "_" + name)).string();
    std::ofstream(p, std::ios::binary) << content;
    return p;
}

TEST(ByteTokenizer, RoundTripsAnyBytes) {
    ByteTokenizer tok;
    std::string s;
    for (int i = 0; i < 256; i++) s.push_back(char(i));
    s += "héllo \xff\xfe <|endoftext|>";
    const auto ids = tok.encode(s);
    EXPECT_EQ(ids.size(), s.size());  // special-token text is plain text
    EXPECT_EQ(tok.decode(ids), s);
    EXPECT_EQ(tok.decode(std::vector<int32_t>{104, 105, 256}), "hi<|endoftext|>");
    EXPECT_EQ(tok.vocab_size(), 257);
}

TEST(Dataset, TextSplitFromTheEnd) {
    ByteTokenizer tok;
    const std::string p = write_tmp("t.txt", std::string(100, 'a') + std::string(100, 'b'));
    const Dataset d = load_dataset(p, tok, {0.1, "text"});
    EXPECT_EQ(d.train.size(), 180u);
    EXPECT_EQ(d.val.size(), 20u);
    EXPECT_EQ(d.val.id(0), 'b');
    fsys::remove(p);
}

TEST(Dataset, InstructionRecordsMaskThePrompt) {
    ByteTokenizer tok;
    const std::string p = write_tmp("i.jsonl", R"({"instruction":"Add.","input":"1+2","output":"3"})"
                                               "\n\n"
                                               R"({"text":"hi"})"
                                               "\n");
    const Dataset d = load_dataset(p, tok, {0.0, "text", PromptTemplate::Compact});
    const std::string prompt = "Add.\n1+2\n=> ";
    ASSERT_EQ(d.train.size(), prompt.size() + 1 + 1 + 2 + 1);
    EXPECT_EQ(d.train.flags(0), kRecordStart);
    for (size_t i = 1; i < prompt.size(); i++) EXPECT_EQ(d.train.flags(i), 0) << i;
    EXPECT_EQ(d.train.id(prompt.size()), '3');
    EXPECT_EQ(d.train.flags(prompt.size()), kInLoss | kNeedsPrompt);
    EXPECT_EQ(d.train.id(prompt.size() + 1), tok.eot_id());
    EXPECT_EQ(d.train.flags(prompt.size() + 1), kInLoss | kNeedsPrompt);
    EXPECT_EQ(d.train.flags(prompt.size() + 2), kInLoss | kRecordStart);  // plain-text record
    EXPECT_EQ(d.train.flags(d.train.size() - 1), kInLoss);
    fsys::remove(p);
}

TEST(Dataset, ErrorsNameFileAndLine) {
    ByteTokenizer tok;
    auto expect = [&](const std::string& content, const std::string& needle) {
        const std::string p = write_tmp("bad.jsonl", content);
        expect_error([&] { load_dataset(p, tok, {0.1, "text"}); }, needle);
        fsys::remove(p);
    };
    expect("{\"text\":\"ok\"}\n{broken\n", "bad.jsonl:2: invalid JSON");
    expect("{\"text\":\"ok\"}\n{\"instruction\":\"x\"}\n",
           ":2: instruction record with missing field \"output\"");
    expect("{\"body\":\"x\"}\n", ":1: record has neither");
    expect("[1,2]\n", ":1: each line must be a JSON object");
    expect("", "file is empty");
    expect("\n\n", "no records");
}

// llm.c's Llama 3 shards (magic 20240801, version 7): uint32 ids, each document opened by BOS, a record
// ending at each BOS; the validation files apart.
TEST(Llmc, Llama3ShardsAreUint32IdsDelimitedByBos) {
    struct BosTokenizer final : Tokenizer {
        std::vector<int32_t> encode(std::string_view) const override { return {}; }
        std::string decode(const int32_t*, size_t) const override { return ""; }
        int vocab_size() const override { return 70000; }
        int eot_id() const override { return 69999; }
        int bos_id() const override { return 69000; }
        std::string kind() const override { return "test"; }
        void save(const std::string&) const override {}
    } tok;
    const std::string dir = fresh_dir("llmc");
    const auto write = [&](const std::string& name, const std::vector<int32_t>& ids) {
        std::vector<int32_t> header(256, 0);
        header[0] = kLlmcMagicLlama3, header[1] = 7, header[2] = int32_t(ids.size());
        std::ofstream f(dir + "/" + name, std::ios::binary);
        f.write(reinterpret_cast<const char*>(header.data()), 1024);
        f.write(reinterpret_cast<const char*>(ids.data()), std::streamsize(ids.size() * 4));
    };
    write("edu_train_000001.bin", {69000, 65536, 3, 69000, 66000});  // ids past uint16
    write("edu_train_000002.bin", {69000, 7});
    write("edu_val_000000.bin", {69000, 1, 2});
    ASSERT_TRUE(is_llmc_dir(dir));
    EXPECT_EQ(llmc_tokenizer_name(dir), "Llama 3");
    const Dataset d = open_llmc(dir, tok);
    ASSERT_EQ(d.train.size(), 7u);
    ASSERT_EQ(d.val.size(), 3u);
    const std::vector<int32_t> ids = {69000, 65536, 3, 69000, 66000, 69000, 7};
    // a record starts at each file's start and after each BOS
    const std::vector<uint8_t> starts = {1, 1, 0, 0, 1, 1, 1};
    for (size_t i = 0; i < ids.size(); i++) {
        EXPECT_EQ(d.train.id(i), ids[i]) << i;
        EXPECT_EQ(d.train.flags(i), uint8_t(kInLoss | (starts[i] ? kRecordStart : 0))) << i;
    }
    EXPECT_EQ(d.val.id(2), 2);
    EXPECT_EQ(d.format, "llm.c Llama 3 shards, 3 files");
    write("edu_val_000001.bin", {20240520});
    std::ofstream(dir + "/edu_val_000001.bin", std::ios::binary | std::ios::in | std::ios::out).write("x", 1);
    expect_error([&] { open_llmc(dir, tok); }, "not an llm.c token shard", "edu_val_000001.bin");
}

TEST(Batcher, SequentialOrderIsTheDocumentedOne) {
    TokenStream s;
    for (int i = 0; i < 50; i++) s.append_one(i, i % 7 != 0 ? kInLoss : 0);
    const int B = 2, T = 4;
    Batcher b(s, B, T, false, 0);
    std::vector<int32_t> tok(B * T), tgt(B * T);
    for (int64_t i = 0; i < 20; i++) {
        b.fill(i, tok.data(), tgt.data());
        for (int r = 0; r < B; r++)
            for (int t = 0; t < T; t++) {
                const int64_t pos = (i * B * T + r * T + t) % 50, nxt = (pos + 1) % 50;
                EXPECT_EQ(tok[size_t(r * T + t)], pos);
                EXPECT_EQ(tgt[size_t(r * T + t)], nxt % 7 != 0 ? nxt : -1);
            }
    }
}

TEST(Batcher, ShuffleServesEveryWindowOncePerEpoch) {
    TokenStream s;
    for (int i = 0; i < 101; i++) s.append_one(i, kInLoss);
    const int B = 2, T = 5;  // 20 windows
    auto order = [&](uint64_t seed, int world, int rank) {
        Batcher b(s, B, T, true, seed, rank, world);
        std::vector<int32_t> starts, tok(B * T), tgt(B * T);
        for (int64_t i = 0; i < 20 / (B * world); i++) {
            b.fill(i, tok.data(), tgt.data());
            for (int r = 0; r < B; r++) {
                starts.push_back(tok[size_t(r * T)]);
                for (int t = 0; t < T; t++) EXPECT_EQ(tgt[size_t(r * T + t)], tok[size_t(r * T + t)] + 1);
            }
        }
        return starts;
    };
    const auto a = order(1, 1, 0);
    EXPECT_EQ(std::set<int32_t>(a.begin(), a.end()).size(), 20u) << "each window once per epoch";
    EXPECT_EQ(a, order(1, 1, 0)) << "deterministic per seed";
    EXPECT_NE(a, order(2, 1, 0)) << "different seeds, different order";
    // two ranks together serve the epoch exactly once
    auto r0 = order(1, 2, 0), r1 = order(1, 2, 1);
    std::multiset<int32_t> all(r0.begin(), r0.end());
    all.insert(r1.begin(), r1.end());
    EXPECT_EQ(all.size(), 20u);
    EXPECT_EQ(std::set<int32_t>(all.begin(), all.end()).size(), 20u);
}

// An instruction output is scored only when its record's first token is inside the row.
TEST(Batcher, AnswersNeedTheirQuestionInTheRow) {
    TokenStream s;  // records of 6 tokens: 3 prompt, 3 output
    for (int r = 0; r < 10; r++)
        for (int k = 0; k < 6; k++)
            s.append_one(r * 6 + k,
                         uint8_t((k == 0 ? kRecordStart : 0) | (k >= 3 ? kInLoss | kNeedsPrompt : 0)));
    const int T = 8;
    Batcher b(s, 1, T, false, 0);
    std::vector<int32_t> tok(T), tgt(T);
    b.fill(1, tok.data(),
           tgt.data());  // tokens 8..15: record 1's output (9..11) is cut from its prompt (6..8)
    for (int t = 0; t < T; t++) {
        const int j = 8 + t + 1, k = j % 6;
        const bool own_prompt_in_row = j / 6 * 6 >= 8;
        EXPECT_EQ(tgt[size_t(t)], k >= 3 && own_prompt_in_row ? j : -1) << "target " << j;
    }
}

// With records, windows start at each record's first token; a record longer than T gets several.
TEST(Batcher, WindowsStartAtRecords) {
    TokenStream s;
    const int lens[] = {5, 12, 3, 9};
    int id = 0;
    for (int len : lens) {
        for (int k = 0; k < len; k++) {
            s.append_one(id++, uint8_t(kInLoss | (k == 0 ? kRecordStart : 0)));
        }
    }
    EXPECT_EQ(window_starts(s, 4), (std::vector<uint64_t>{0, 4, 5, 9, 13, 17, 20, 24}));
    Batcher b(s, 1, 4, true, 3);
    EXPECT_EQ(b.windows(), 8);
    std::set<int32_t> firsts;
    std::vector<int32_t> tok(4), tgt(4);
    for (int i = 0; i < 8; i++) {
        b.fill(i, tok.data(), tgt.data());
        firsts.insert(tok[0]);
    }
    EXPECT_EQ(firsts, (std::set<int32_t>{0, 4, 5, 9, 13, 17, 20, 24})) << "each window once per epoch";
}

// --neftune-alpha's L: each position gets the number of its record's tokens in the row; a record cut by the
// row's start or end counts only what the row holds. The tokens and targets are what fill gives without it.
TEST(Batcher, LengthsAreEachRecordsShareOfTheRow) {
    TokenStream s;
    const int lens[] = {5, 12, 3, 9, 1, 6};
    std::vector<int> record_of;
    for (int r = 0, id = 0; r < 6; r++)
        for (int k = 0; k < lens[r]; k++, id++) {
            s.append_one(id, uint8_t(kInLoss | (k == 0 ? kRecordStart : 0)));
            record_of.push_back(r);
        }
    const int N = int(record_of.size()), B = 2, T = 7;
    for (bool shuffle : {false, true}) {
        Batcher b(s, B, T, shuffle, 5), plain(s, B, T, shuffle, 5);
        std::vector<int32_t> tok(B * T), tgt(B * T), len(B * T), tok0(B * T), tgt0(B * T);
        for (int64_t i = 0; i < 12; i++) {
            b.fill(i, tok.data(), tgt.data(), len.data());
            plain.fill(i, tok0.data(), tgt0.data());
            EXPECT_EQ(tok, tok0) << "batch " << i;
            EXPECT_EQ(tgt, tgt0) << "batch " << i;
            for (int r = 0; r < B; r++)
                for (int t = 0; t < T; t++) {
                    const int32_t* row = tok.data() + size_t(r) * T;
                    // the record of the token at t; a wrap to the stream's start begins a record
                    auto same = [&](int u) { return record_of[size_t(row[u])] == record_of[size_t(row[t])]; };
                    int first = t, last = t;
                    while (first > 0 && same(first - 1) && row[first - 1] + 1 == row[first]) first--;
                    while (last + 1 < T && same(last + 1) && row[last] + 1 == row[last + 1]) last++;
                    EXPECT_EQ(len[size_t(r * T + t)], last - first + 1)
                        << (shuffle ? "shuffled" : "sequential") << " batch " << i << " row " << r
                        << " token " << row[t] << " of " << N;
                }
        }
    }
}

TEST(Batcher, EvalWindowsScoreEveryTargetOnce) {
    for (bool records : {false, true}) {
        TokenStream s;  // 23 tokens; with records: lengths 7, 3, 13 (longer than T)
        for (int i = 0; i < 23; i++)
            s.append_one(i, uint8_t(kInLoss | (records && (i == 0 || i == 7 || i == 10) ? kRecordStart : 0)));
        const int B = 2, T = 4;
        const auto starts = window_starts(s, T, true);
        std::vector<int32_t> tok(B * T), tgt(B * T);
        std::multiset<int32_t> seen;
        for (int64_t i = 0; i < eval_batches(starts, B); i++) {
            fill_eval_batch(s, starts, B, T, i, tok.data(), tgt.data());
            for (int r = 0; r < B; r++)
                for (int t = 0; t < T; t++)
                    if (tgt[size_t(r * T + t)] >= 0) {
                        seen.insert(tgt[size_t(r * T + t)]);
                        EXPECT_EQ(tgt[size_t(r * T + t)], tok[size_t(r * T + t)] + 1);
                    }
        }
        EXPECT_EQ(seen.size(), 22u) << "records " << records;
        EXPECT_EQ(std::set<int32_t>(seen.begin(), seen.end()).size(), 22u) << "records " << records;
    }
}

TEST(Synthetic, ExamplesAreCorrectUniqueAndSeeded) {
    const auto a = synthetic_examples(3000, 1);
    ASSERT_EQ(a.size(), 3000u);
    std::set<std::pair<std::string, std::string>> seen;
    for (const auto& e : a) {
        EXPECT_TRUE(seen.insert({e.instruction, e.input}).second) << "duplicate " << e.instruction << e.input;
        std::string want = e.input;
        if (e.instruction == "Reverse.")
            want.assign(e.input.rbegin(), e.input.rend());
        else if (e.instruction == "Sort.")
            std::sort(want.begin(), want.end());
        else if (e.instruction == "Uppercase.")
            for (char& c : want) c = char(std::toupper(c));
        else
            ADD_FAILURE() << "unknown task " << e.instruction;
        EXPECT_EQ(e.output, want);
    }
    EXPECT_EQ(synthetic_examples(5, 1)[3].input, a[3].input);
}

}  // namespace
}  // namespace anvil::test
