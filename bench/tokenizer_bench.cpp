// Tokenizer throughput: MB/s of text encoded by one thread, the figure tiktoken publishes (6.4 MB/s on one
// thread for the GPT-2 tokenizer, read off its README's chart). Any tokenizer anvil reads: GPT-2's files, or a
// tokenizer.json (Llama 3's Split pattern, Llama 2's SentencePiece-style BPE).
//   anvil_tokenizer_bench TOKENIZER [FILES...]
// Without files it reads English prose every Debian system has (/usr/share/common-licenses and the
// copyright files under /usr/share/doc). The first pass warms the piece cache as a long run would; the
// figure is the median of 5 timed passes.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/bpe.h"
#include "io/fs.h"

int main(int argc, char** argv) {
    using namespace anvil;
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s VOCAB_DIR [FILES...]\n", argv[0]);
        return 2;
    }
    try {
        const std::unique_ptr<Tokenizer> tp = make_tokenizer(argv[1]);
        const Tokenizer& tok = *tp;
        std::string corpus;
        if (argc > 2) {
            for (int i = 2; i < argc; i++) corpus += read_file(argv[i]);
        } else {
            namespace fs = std::filesystem;
            std::vector<std::string> files;
            for (const auto& e : fs::recursive_directory_iterator("/usr/share/common-licenses"))
                if (e.is_regular_file()) files.push_back(e.path());
            for (const auto& e : fs::directory_iterator("/usr/share/doc"))
                if (fs::is_regular_file(e.path() / "copyright")) files.push_back(e.path() / "copyright");
            std::sort(files.begin(), files.end());
            for (const auto& f : files) corpus += read_file(f) + "\n";
        }
        const double mb = double(corpus.size()) / 1e6;
        size_t tokens = tok.encode(corpus).size();  // warm-up
        std::vector<double> secs;
        for (int r = 0; r < 5; r++) {
            const auto t0 = std::chrono::steady_clock::now();
            tokens = tok.encode(corpus).size();
            secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        std::sort(secs.begin(), secs.end());
        const double s = secs[2];
        std::printf("corpus %.2f MB, %zu tokens (%.2f bytes/token)\n", mb, tokens,
                    double(corpus.size()) / double(tokens));
        std::printf("anvil %s, 1 thread: %.1f MB/s (median of 5), %.2f M tokens/s\n", argv[1], mb / s,
                    double(tokens) / s / 1e6);
        std::printf("tiktoken's published figure, 1 thread: 6.4 MB/s -> ratio %.2fx\n", mb / s / 6.4);
        return 0;
    } catch (const anvil::Error& e) {
        std::fprintf(stderr, "anvil_tokenizer_bench: %s\n", e.what());
        return 1;
    }
}
