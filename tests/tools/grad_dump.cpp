// Test tool for the PyTorch oracle: loads a model directory and a data file, computes step 0's loss and
// gradients exactly as `anvil train --shuffle off` does, and writes the gradients of the trainable
// parameters as safetensors under their names (the loss goes in the metadata). With ADAPTER_DIR (a PEFT LoRA
// adapter) the base is frozen and the gradients are the adapters'. ANVIL_DROPOUT=P trains with --dropout P
// (the attention probabilities too); the metadata's pass_seeds are the micro-batches' pass seeds (the masks'
// seeds), comma-separated.
//   anvil_grad_dump MODEL_DIR DATA_FILE BATCH SEQ GRAD_ACCUM OUT.safetensors [TEMPLATE [ADAPTER_DIR]]
#include <cstdio>
#include <cstdlib>

#include "data/batcher.h"
#include "data/dataset.h"
#include "io/safetensors.h"
#include "model/lora.h"
#include "model/model_io.h"
#include "train/trainer.h"

int main(int argc, char** argv) {
    using namespace anvil;
    if (argc < 7 || argc > 9) {
        std::fprintf(stderr, "usage: %s MODEL_DIR DATA_FILE BATCH SEQ GRAD_ACCUM OUT.safetensors [TEMPLATE [ADAPTER]]\n",
                     argv[0]);
        return 2;
    }
    try {
        const std::string dir = argv[1], data = argv[2], out = argv[6];
        const int B = std::atoi(argv[3]), T = std::atoi(argv[4]), accum = std::atoi(argv[5]);
        auto be = make_backend({Device::CPU, 0, 0});
        ModelOptions mo;
        if (argc == 9) mo.lora = read_peft_config(argv[8]).lora;
        if (const char* p = std::getenv("ANVIL_DROPOUT"))
            mo.dropout = mo.attn_dropout = std::strtof(p, nullptr);
        auto model = make_model(*be, read_model_config(dir), mo);
        load_model_weights(dir, *model);
        if (argc == 9) load_peft_weights(argv[8], *model);
        model->reserve(B, T, true);
        AdamW opt(model->params(), 0.0f);
        Trainer trainer(*model, opt);
        ByteTokenizer tok;
        const Dataset d =
            load_dataset(data, tok, DataOptions{0.0, "text", choose_template(argc >= 8 ? argv[7] : "alpaca", tok)});
        Batcher batcher(d.train, B, T, false, 0);
        std::vector<int32_t> tokens, targets;
        const StepBatch batch = fill_step(batcher, 0, accum, B, T, tokens, targets);
        const StepStats r = trainer.gradients(batch, accum, B, T);
        const ParamStore& s = model->params();
        std::vector<std::vector<float>> host;
        std::vector<StTensor> ts;
        for (size_t i : s.trainable()) {
            host.emplace_back(static_cast<size_t>(s.grad(i).numel()));
            be->download(host.back().data(), s.grad(i));
            const Shape& sh = s.spec(i).shape;
            ts.push_back({s.spec(i).name, DType::F32, {sh.dims.begin(), sh.dims.begin() + sh.ndim}, nullptr});
        }
        for (size_t k = 0; k < ts.size(); k++) ts[k].data = host[k].data();
        std::string seeds;
        for (int m = 0; m < accum; m++) seeds += (m ? "," : "") + std::to_string(trainer.pass_seed(0, m));
        write_safetensors(out, ts, {{"loss", fmt::format("{:.9g}", r.loss)}, {"pass_seeds", seeds}});
        std::printf("%.9g\n", r.loss);
        return 0;
    } catch (const Error& e) {
        std::fprintf(stderr, "anvil_grad_dump: %s\n", e.what());
        return 1;
    }
}
