// Loader throughput: tokens/s the background loader serves (batch building from memory-mapped shards,
// shuffled record-aligned windows), against what training consumes.
//   anvil_loader_bench DATA_DIR [BATCH SEQ ACCUM TRAINER_TOKENS_PER_S]
// DATA_DIR is an `anvil data prepare` output. Defaults: the embedded run's batch 32 x 64 and the
// 18607 tokens/s that run trains at on the 2-core development VM (README).
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "backend/backend.h"
#include "core/error.h"
#include "data/dataset.h"
#include "data/prefetch.h"

int main(int argc, char** argv) {
    using namespace anvil;
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s DATA_DIR [BATCH SEQ ACCUM TRAINER_TOKENS_PER_S]\n", argv[0]);
        return 2;
    }
    try {
        const int B = argc > 2 ? std::atoi(argv[2]) : 32, T = argc > 3 ? std::atoi(argv[3]) : 64;
        const int accum = argc > 4 ? std::atoi(argv[4]) : 1;
        const double trainer = argc > 5 ? std::atof(argv[5]) : 18607.0;
        const std::string dir = argv[1];
        const auto tok = tokenizer_for_prepared(dir);
        const Dataset d = open_prepared(dir, *tok);
        auto be = make_backend({Device::CPU, 1, 0});
        Prefetcher pf(Batcher(d.train, B, T, true, 1), *be, {.B = B, .T = T, .accum = accum});
        const int steps = 20000;
        double waited = 0, w;
        const auto t0 = std::chrono::steady_clock::now();
        int64_t checksum = 0;
        for (int s = 0; s < steps; s++) {
            const StepBatch b = pf.acquire(s, &w);
            checksum += b.target_count;
            waited += w;
            pf.release();
        }
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const double tps = double(steps) * B * T * accum / secs;
        std::printf("loader: %d steps of %d x %d x %d from %s: %.2f M tokens/s (%lld targets)\n", steps, B, T,
                    accum, dir.c_str(), tps / 1e6, (long long)checksum);
        std::printf("trainer consumes %.0f tokens/s: the loader has %.0fx headroom\n", trainer,
                    tps / trainer);
        return 0;
    } catch (const Error& e) {
        std::fprintf(stderr, "anvil_loader_bench: %s\n", e.what());
        return 1;
    }
}
