// Test tool for interoperability checks: the logits anvil computes for one token sequence, as JSON.
//   anvil_logits_dump MODEL_DIR ADAPTER_DIR|- ID,ID,...
// MODEL_DIR is a model directory (or a LoRA run's, which names its base); ADAPTER_DIR a PEFT adapter or "-".
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "io/json_text.h"
#include "runtime/inference.h"

int main(int argc, char** argv) {
    using namespace anvil;
    if (argc != 4) {
        std::fprintf(stderr, "usage: %s MODEL_DIR ADAPTER_DIR|- ID,ID,...\n", argv[0]);
        return 2;
    }
    try {
        InferenceOptions io;
        io.model_dir = argv[1];
        if (std::string(argv[2]) != "-") io.adapter = argv[2];
        io.tokenizer = "byte";  // the ids are given: a checkpoint transformers saved names no tokenizer
        InferenceSetup l = setup_inference(io);
        std::vector<int32_t> ids;
        std::stringstream ss(argv[3]);
        std::string tok;
        while (std::getline(ss, tok, ',')) ids.push_back(std::atoi(tok.c_str()));
        const int T = int(ids.size()), V = l.model->config().vocab_size;
        l.model->reserve(1, T, false);
        const ForwardPass f{.tokens = l.model->tokens(1, T)};
        l.backend->upload(f.tokens, ids.data());
        l.model->forward(f);
        std::vector<float> logits(size_t(T) * V);
        l.backend->download(logits.data(), l.model->logits(1, T));
        nlohmann::json rows = nlohmann::json::array();
        for (int t = 0; t < T; t++)
            rows.push_back(std::vector<float>(logits.begin() + t * V, logits.begin() + (t + 1) * V));
        std::printf("%s\n", json_text(rows).c_str());
        return 0;
    } catch (const Error& e) {
        std::fprintf(stderr, "anvil_logits_dump: %s\n", e.what());
        return 1;
    }
}
