// Instrument arithmetic: cost, price presets, byte sizes, FLOPs per token, TFRecord CRC, the CPU memory
// limit.
#include <cmath>

#include "core/progress.h"
#include "harness.h"
#include "io/tensorboard.h"
#include "model/config.h"
#include "monitor/cost.h"
#include "monitor/hwbench.h"
#include "core/sizes.h"

namespace anvil::test {
namespace {

TEST(Cost, Arithmetic) {
    // $3.60/h for 100 s = $0.10; 2M tokens -> $0.05 per million; 50 more steps of 2 s -> +$0.10
    const CostEstimate c = estimate_cost(3.6, 100.0, 2e6, 2.0, 50);
    EXPECT_DOUBLE_EQ(c.so_far, 0.1);
    EXPECT_DOUBLE_EQ(c.per_million, 0.05);
    EXPECT_DOUBLE_EQ(c.projected_s, 100.0);
    EXPECT_DOUBLE_EQ(c.projected, 0.2);
    EXPECT_DOUBLE_EQ(parse_price_per_hour("2.5"), 2.5);
    EXPECT_DOUBLE_EQ(parse_price_per_hour("h100"), 2.99);
    EXPECT_DOUBLE_EQ(parse_price_per_hour(""), 0.0);
    EXPECT_THROW(parse_price_per_hour("tpu"), Error);
    EXPECT_THROW(parse_price_per_hour("-1"), Error);
}

TEST(Units, ParseBytes) {
    EXPECT_EQ(parse_bytes("512M", "--x"), 512ull << 20);
    EXPECT_EQ(parse_bytes("2G", "--x"), 2ull << 30);
    EXPECT_EQ(parse_bytes("1.5GiB", "--x"), 3ull << 29);
    EXPECT_EQ(parse_bytes("4096", "--x"), 4096u);
    EXPECT_THROW(parse_bytes("lots", "--x"), Error);
    EXPECT_THROW(parse_bytes("3Q", "--x"), Error);
    EXPECT_THROW(parse_bytes("0", "--x"), Error);
    EXPECT_EQ(parse_bytes("0", "--x", true), 0u) << "where 0 turns the flag's feature off";
    EXPECT_THROW(parse_bytes("-1M", "--x", true), Error);
}

TEST(Mfu, FlopsPerTokenMatchesNanoGpt) {
    ModelConfig c;  // GPT-2 124M
    c.n_layer = 12;
    c.n_head = 12;
    c.n_embd = 768;
    c.n_ctx = 1024;
    c.vocab_size = 50257;
    // N without wpe = 124,439,808 - 786,432 = 123,653,376; 6N + 12*12*768*1024
    EXPECT_DOUBLE_EQ(c.flops_per_token(1024), 6.0 * 123653376.0 + 12.0 * 12 * 768 * 1024);
}

TEST(TensorBoard, MaskedCrcKnownValue) {
    // CRC-32C("123456789") = 0xE3069283 (the check value of the Castagnoli polynomial), then TFRecord's mask
    const uint32_t crc = 0xE3069283u;
    EXPECT_EQ(tfrecord_masked_crc("123456789", 9), ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
}

TEST(Memory, LimitThrowsOutOfMemoryAndAccounts) {
    auto be = make_backend({Device::CPU, 1, 0});
    be->set_memory_limit(1 << 20);
    {
        Buffer a = be->alloc(600 << 10);
        EXPECT_GE(be->memory_in_use(), size_t(600 << 10));
        EXPECT_THROW(be->alloc(600 << 10), OutOfMemory);
    }
    EXPECT_EQ(be->memory_in_use(), 0u);
    Buffer b = be->alloc(900 << 10);  // fits again once the first is freed
    EXPECT_GE(be->memory_peak(), size_t(900 << 10));
}

TEST(Bench, CpuReportIsSane) {
    const HwBenchReport r = cpu_hw_bench(1, true);
    ASSERT_EQ(r.results.size(), 2u);
    EXPECT_EQ(r.results[0].name, "matmul_fp32");
    EXPECT_GT(r.results[0].measured, 1e-3);  // TFLOP/s: above 1 GFLOP/s
    EXPECT_LT(r.results[0].measured, 100.0);
    EXPECT_GT(r.results[1].measured, 0.5);  // GB/s
    const auto j = bench_to_json(r, 2.0);
    EXPECT_EQ(j["device"]["kind"], "cpu");
    EXPECT_TRUE(j["results"][0].contains("usd_per_pflop"));
    EXPECT_NEAR(j["results"][0]["usd_per_pflop"].get<double>(), 2.0 / (r.results[0].measured * 3.6), 1e-9);
}

TEST(Datasheet, KnownCards) {
    ASSERT_NE(find_datasheet("NVIDIA H100 80GB HBM3"), nullptr);
    EXPECT_DOUBLE_EQ(find_datasheet("NVIDIA H100 80GB HBM3")->bf16, 989.4);
    EXPECT_DOUBLE_EQ(find_datasheet("NVIDIA H200")->mem_gbps, 4800);
    EXPECT_DOUBLE_EQ(find_datasheet("NVIDIA H100 PCIe")->bf16, 756);
    EXPECT_EQ(find_datasheet("Some Other GPU"), nullptr);
}

// Off a terminal, a progress line each time the count passes a multiple of `every`, however far it moves in
// one update, and one at the end.
TEST(Progress, OffATerminalALineEachTimeTheCountPassesAMultiple) {
    std::FILE* f = std::tmpfile();
    ASSERT_NE(f, nullptr);
    Progress quiet("steps", 30, 10, "steps", f);
    Progress rows("rows", 200, 50, "rows", f);
    for (int done : {32, 64, 96, 128, 160, 192, 200}) rows.update(done, "");  // passes 50, 100, 150; ends
    for (int done = 1; done <= 30; done++) quiet.update(done, "");            // 10, 20, 30
    std::rewind(f);
    std::string out(4096, '\0');
    out.resize(std::fread(out.data(), 1, out.size(), f));
    std::fclose(f);
    std::vector<std::string> firsts;
    for (size_t p = 0; p < out.size();) {
        const size_t nl = out.find('\n', p);
        const std::string line = out.substr(p, nl - p);
        firsts.push_back(line.substr(0, line.find('/')));
        p = nl + 1;
    }
    EXPECT_EQ(firsts, (std::vector<std::string>{"rows 64", "rows 128", "rows 160", "rows 200", "steps 10",
                                                "steps 20", "steps 30"}))
        << out;
}

// Byte counts read in the unit of their total: kB under a megabyte, MB, GB from a gigabyte.
TEST(Progress, BytesInTheUnitOfTheirTotal) {
    const auto line = [](int64_t total) {
        std::FILE* f = std::tmpfile();
        Progress p("prepare", total, 1, "B", f);
        p.update(total, "");
        std::rewind(f);
        std::string out(256, '\0');
        out.resize(std::fread(out.data(), 1, out.size(), f));
        std::fclose(f);
        return out.substr(0, out.find(" 100%"));
    };
    EXPECT_EQ(line(46'507), "prepare 46.5/46.5 kB");
    EXPECT_EQ(line(3'500'000), "prepare 3.5/3.5 MB");
    EXPECT_EQ(line(12'300'000'000), "prepare 12.3/12.3 GB");
}

}  // namespace
}  // namespace anvil::test
