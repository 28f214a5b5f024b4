// anvil quantize: a float model directory (optionally with a LoRA adapter folded in first) -> an int8 one.
#include <chrono>
#include <memory>

#include "cli/commands.h"
#include "core/sizes.h"
#include "io/fs.h"
#include "model/model_io.h"
#include "model/quantize.h"
#include "runtime/inference.h"

namespace anvil::cli {

Command add_quantize(CLI::App& app) {
    CLI::App* sub = app.add_subcommand("quantize",
                                       "write an int8 copy of a model: weight-only, symmetric, one f32 scale "
                                       "per output channel (safetensors I8 "
                                       "weights + F32 scales, quantization_config in config.json); generate, "
                                       "eval, serve and LoRA training load it");
    struct Opts {
        InferenceOptions in;
        OutputFlags out;
        std::string json;
    };
    auto o = std::make_shared<Opts>();
    sub->add_option("--model", o->in.model_dir, "the float model directory (or a run directory: its final/)")
        ->required();
    sub->add_option("--adapter", o->in.adapter,
                    "a PEFT LoRA adapter to fold into the weights before quantizing");
    sub->add_option(
        "--tokenizer", o->in.tokenizer,
        "the tokenizer to save with the output (default: the model's, when its directory has one)");
    o->in.weights_only = true;
    o->out.add(sub, o->in.threads, "the int8 model directory to write");
    add_json_flag(sub, o->json);
    return {
        sub, [o]() -> int {
            o->out.check_out();
            const auto t0 = std::chrono::steady_clock::now();
            InferenceSetup l = setup_inference(o->in);
            ANVIL_CHECK(!l.model->config().int8_weights,
                        "--model {}: its weights are int8 already (quantization_config in config.json); give "
                        "the float model",
                        l.base_dir);
            if (l.model->has_adapters()) merge_lora(*l.model);
            ModelConfig cfg = l.model->config();
            cfg.int8_weights = true;
            std::unique_ptr<Model> q = make_model(*l.backend, cfg);
            const QuantizeReport r = quantize_model(*l.model, *q);
            o->out.save(*q, l, DType::F32);
            const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            const std::string text = fmt::format(
                "quantized {}{}{}: {} weight matrices ({:.3g}M values) to int8, largest relative RMS error "
                "{:.4f}; parameters {:.1f} MB -> {:.1f} MB ({:.2f}x smaller); {} in {:.1f} s\n",
                l.base_dir, l.adapter_dir.empty() ? "" : " + ", l.adapter_dir, r.tensors,
                double(r.weights) / 1e6, r.max_rel_error, double(r.bytes_before) / 1e6,
                double(r.bytes_after) / 1e6,
                double(r.bytes_before) / double(std::max<size_t>(r.bytes_after, 1)), o->out.out, secs);
            const nlohmann::json j = {{"model", l.base_dir},
                                      {"adapter", l.adapter_dir},
                                      {"out", o->out.out},
                                      {"tensors", r.tensors},
                                      {"weights", r.weights},
                                      {"max_rel_error", r.max_rel_error},
                                      {"bytes_before", r.bytes_before},
                                      {"bytes_after", r.bytes_after},
                                      {"seconds", secs}};
            emit_result(o->json, j, text);
            return 0;
        }};
}

}  // namespace anvil::cli
