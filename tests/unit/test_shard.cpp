// Shards: round trip, every way a file can be damaged, and the loader's epoch over ranks.
#include <filesystem>
#include <fstream>
#include <set>

#include "data/batcher.h"
#include "data/prefetch.h"
#include "data/shard.h"
#include "harness.h"

namespace anvil::test {
namespace {

namespace fsys = std::filesystem;

std::string tmp_path(const std::string& name) {
    return (fsys::temp_directory_path() / ("anvil_shard_" + std::to_string(::getpid()) + "_" + name))
        .string();
}

TEST(Shard, RoundTripNarrowAndWide) {
    for (int vocab : {300, 70000}) {
        const std::string p = tmp_path("rt.bin");
        std::vector<int32_t> ids;
        std::vector<uint8_t> fl;
        for (int i = 0; i < 1000; i++) {
            ids.push_back((i * 7919) % vocab);
            fl.push_back(uint8_t(i % 3 == 0 ? kRecordStart : kInLoss));
        }
        {
            ShardWriter w(p, vocab, true);
            w.append(ids.data(), fl.data(), 600);
            w.end_record();
            EXPECT_FALSE(fsys::exists(p)) << "nothing at the final path before close";
            w.append(ids.data() + 600, fl.data() + 600, 400);
            w.end_record();
            w.close();
        }
        Shard s(p);
        EXPECT_EQ(s.tokens(), 1000u);
        EXPECT_EQ(s.records(), 2u);
        EXPECT_EQ(s.width(), vocab <= 65536 ? 2 : 4);
        const TokenView v({s.segment(-1)});
        for (size_t i = 0; i < ids.size(); i++) {
            ASSERT_EQ(v.id(i), ids[i]) << i;
            ASSERT_EQ(v.flags(i), fl[i]) << i;
        }
        fsys::remove(p);
    }
}

TEST(Shard, FlaglessShardsMarkRecordsAfterEndOfText) {
    const std::string p = tmp_path("nf.bin");
    const std::vector<int32_t> ids = {5, 6, 9, 7, 9, 8};  // 9 = end-of-text
    {
        ShardWriter w(p, 10, false);
        w.append(ids.data(), nullptr, ids.size());
        w.close();
    }
    Shard s(p);
    const TokenView v({s.segment(9)});
    const std::vector<uint8_t> want = {kInLoss | kRecordStart, kInLoss, kInLoss,
                                       kInLoss | kRecordStart, kInLoss, kInLoss | kRecordStart};
    for (size_t i = 0; i < ids.size(); i++) EXPECT_EQ(v.flags(i), want[i]) << i;
    fsys::remove(p);
}

void expect_bad(const std::string& p, const std::string& needle) {
    expect_error([&] { Shard s(p); }, needle, p);
}

TEST(Shard, RejectsDamagedFiles) {
    const std::string p = tmp_path("good.bin");
    std::vector<int32_t> ids(100, 3);
    {
        ShardWriter w(p, 50, false);
        w.append(ids.data(), nullptr, ids.size());
        w.close();
    }
    std::string bytes;
    {
        std::ifstream f(p, std::ios::binary);
        bytes.assign(std::istreambuf_iterator<char>(f), {});
    }
    auto variant = [&](const std::string& name, std::string b) {
        const std::string q = tmp_path(name);
        std::ofstream(q, std::ios::binary) << b;
        return q;
    };
    expect_bad(variant("trunc.bin", bytes.substr(0, bytes.size() - 10)), "truncated or padded");
    expect_bad(variant("short.bin", bytes.substr(0, 20)), "truncated shard");
    std::string b = bytes;
    b[0] = 'X';
    expect_bad(variant("magic.bin", b), "bad magic");
    b = bytes;
    b[8] = 9;
    expect_bad(variant("version.bin", b), "version 9");
    b = bytes;
    b[12] = 3;
    expect_bad(variant("width.bin", b), "token width 3");
    b = bytes;
    b[16] = 2;  // vocabulary 2, ids are 3
    expect_bad(variant("vocab.bin", b), "outside the vocabulary");
    b = bytes;
    b[12] = 4;
    b[19] =
        char(0xfc);  // width 4 and a vocabulary past 2^31: ids would read back negative (found by fuzz_shard)
    expect_bad(variant("hugevocab.bin", b), "out of range");
    b = bytes;
    b[24] = char(0xff);  // count lies
    expect_bad(variant("count.bin", b), "truncated or padded");
    expect_bad(variant("empty.bin", ""), "truncated shard");
    for (const char* n : {"trunc.bin", "short.bin", "magic.bin", "version.bin", "width.bin", "vocab.bin",
                          "count.bin", "empty.bin", "hugevocab.bin"})
        fsys::remove(tmp_path(n));
    fsys::remove(p);
}

// Plain text: every token is an input exactly once per epoch, over any number of ranks.
TEST(Loader, EveryTokenOncePerEpochAcrossRanks) {
    TokenStream s;
    const int N =
        4 * 60 + 1;  // 60 windows of T=4 (divisible by B * world for every world below), last target
    for (int i = 0; i < N; i++) s.append_one(i, kInLoss);
    const int B = 2, T = 4;
    for (int world : {1, 2, 3}) {
        std::multiset<int32_t> seen;
        const int64_t windows = (N - 1) / T;
        const int64_t batches = windows / (B * world);
        for (int rank = 0; rank < world; rank++) {
            Batcher b(s, B, T, true, 11, rank, world);
            std::vector<int32_t> tok(B * T), tgt(B * T);
            for (int64_t i = 0; i < batches; i++) {
                b.fill(i, tok.data(), tgt.data());
                seen.insert(tok.begin(), tok.end());
            }
        }
        EXPECT_EQ(seen.size(), size_t(N - 1)) << "world " << world;
        EXPECT_EQ(std::set<int32_t>(seen.begin(), seen.end()).size(), size_t(N - 1)) << "world " << world;
    }
}

// The prefetcher serves exactly what the batcher builds, in order, from any starting step.
TEST(Loader, PrefetcherMatchesBatcher) {
    TokenStream s;
    for (int i = 0; i < 500; i++) s.append_one(i % 97, i % 5 ? kInLoss : 0);
    auto be = make_backend({Device::CPU, 1, 0});
    const int B = 3, T = 8, accum = 2;
    Batcher ref(s, B, T, true, 5);
    Prefetcher pf(Batcher(s, B, T, true, 5), *be,
                  {.B = B, .T = T, .accum = accum, .first_step = 7, .depth = 3});
    std::vector<int32_t> tok(B * T), tgt(B * T);
    for (int64_t step = 7; step < 40; step++) {
        double waited = -1;
        const StepBatch sb = pf.acquire(step, &waited);
        EXPECT_GE(waited, 0.0);
        int64_t count = 0;
        for (int m = 0; m < accum; m++) {
            ref.fill(step * accum + m, tok.data(), tgt.data());
            for (int i = 0; i < B * T; i++) {
                ASSERT_EQ(sb.tokens[m * B * T + i], tok[size_t(i)]);
                ASSERT_EQ(sb.targets[m * B * T + i], tgt[size_t(i)]);
                count += tgt[size_t(i)] >= 0;
            }
        }
        EXPECT_EQ(sb.target_count, count);
        pf.release();
    }
}

}  // namespace
}  // namespace anvil::test
