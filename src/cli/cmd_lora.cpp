// anvil lora merge: a base model plus a PEFT LoRA adapter -> a plain Hugging Face model directory.
#include <memory>

#include "cli/commands.h"
#include "io/fs.h"
#include "model/model_io.h"
#include "train/autobatch.h"
#include "train/run_setup.h"

namespace anvil::cli {

Command add_lora(CLI::App& app) {
    CLI::App* sub = app.add_subcommand("lora", "LoRA adapters");
    sub->require_subcommand(1);
    CLI::App* merge = sub->add_subcommand(
        "merge", "fold a PEFT LoRA adapter into its base: W += s (B A)^T; writes a plain model directory");
    struct Opts {
        InferenceOptions in;
        std::string out;
        bool overwrite = false;
        std::string dtype = "f32", max_shard = "5G";
    };
    auto o = std::make_shared<Opts>();
    merge->add_option("--model", o->in.model_dir, "the base model directory")->required();
    merge->add_option("--adapter", o->in.adapter, "the PEFT adapter directory (adapter_config.json)")->required();
    merge->add_option("--out", o->out, "the merged model directory to write")->required();
    merge->add_option("--dtype", o->dtype, "dtype of the written weights: f32, bf16 or f16")
        ->capture_default_str()
        ->check(CLI::IsMember({"f32", "bf16", "f16"}));
    merge->add_option("--max-shard-size", o->max_shard, "largest weight file; larger models are sharded")
        ->capture_default_str();
    merge->add_flag("--overwrite", o->overwrite, "replace --out if it exists");
    merge->add_option("--threads", o->in.threads, "CPU threads (0 = all cores)")->check(kNonNegative);
    return {sub, [o]() -> int {
                ANVIL_CHECK(o->overwrite || !(dir_exists(o->out) || file_exists(o->out)),
                            "--out {}: already exists; choose another directory or pass --overwrite", o->out);
                const SaveFormat format{o->dtype == "bf16" ? DType::BF16 : o->dtype == "f16" ? DType::F16 : DType::F32,
                                        parse_bytes(o->max_shard, "--max-shard-size")};
                InferenceSetup l = setup_inference(o->in);
                merge_lora(*l.model);
                const std::string tmp = temp_dir_for(o->out);
                make_dirs(tmp);
                const nlohmann::json extra = {{"anvil_tokenizer", l.tok->kind()},
                                        {"anvil_template", template_name(l.prompt)}};
                write_model_dir(tmp, *l.model, extra, {}, format);
                l.tok->save(tmp);
                replace_dir(tmp, o->out);
                std::printf("merged %s into %s: %s\n", l.adapter_dir.c_str(), l.base_dir.c_str(), o->out.c_str());
                return 0;
            }};
}

}  // namespace anvil::cli
