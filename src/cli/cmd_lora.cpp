// anvil lora merge: a base model plus a PEFT LoRA adapter -> a plain Hugging Face model directory.
#include <memory>

#include "cli/commands.h"
#include "core/sizes.h"
#include "io/fs.h"
#include "model/model_io.h"
#include "runtime/inference.h"

namespace anvil::cli {

Command add_lora(CLI::App& app) {
    CLI::App* sub = app.add_subcommand("lora", "LoRA adapters");
    sub->require_subcommand(1);
    CLI::App* merge = sub->add_subcommand(
        "merge", "fold a PEFT LoRA adapter into its base: W += s (B A)^T; writes a plain model directory");
    struct Opts {
        InferenceOptions in;
        OutputFlags out;
        std::string dtype = "f32", json;
    };
    auto o = std::make_shared<Opts>();
    merge->add_option("--model", o->in.model_dir, "the base model directory")->required();
    merge->add_option("--adapter", o->in.adapter, "the PEFT adapter directory (adapter_config.json)")
        ->required();
    merge->add_option(
        "--tokenizer", o->in.tokenizer,
        "the tokenizer to save with the output (default: the model's, when its directory has one)");
    o->in.weights_only = true;
    o->out.add(merge, o->in.threads, "the merged model directory to write");
    merge->add_option("--dtype", o->dtype, "dtype of the written weights: f32, bf16 or f16")
        ->capture_default_str()
        ->check(CLI::IsMember({"f32", "bf16", "f16"}));
    add_json_flag(merge, o->json);
    return {sub, [o]() -> int {
                o->out.check_out();
                InferenceSetup l = setup_inference(o->in);
                merge_lora(*l.model);
                o->out.save(*l.model, l, weight_dtype(o->dtype));
                const nlohmann::json j = {{"model", l.base_dir},
                                          {"adapter", l.adapter_dir},
                                          {"out", o->out.out},
                                          {"dtype", o->dtype},
                                          {"params", l.model->params().numel()}};
                emit_result(o->json, j,
                            fmt::format("merged {} into {}: {}\n", l.adapter_dir, l.base_dir, o->out.out));
                return 0;
            }};
}

}  // namespace anvil::cli
