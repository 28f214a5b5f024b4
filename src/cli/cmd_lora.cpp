// anvil lora merge: a base model plus a PEFT LoRA adapter -> a plain Hugging Face model directory.
#include <memory>

#include "cli/commands.h"
#include "io/fs.h"
#include "model/model_io.h"
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
    };
    auto o = std::make_shared<Opts>();
    merge->add_option("--model", o->in.model_dir, "the base model directory")->required();
    merge->add_option("--adapter", o->in.adapter, "the PEFT adapter directory (adapter_config.json)")->required();
    merge->add_option("--out", o->out, "the merged model directory to write")->required();
    merge->add_flag("--overwrite", o->overwrite, "replace --out if it exists");
    merge->add_option("--threads", o->in.threads, "CPU threads (0 = all cores)")->check(kNonNegative);
    return {sub, [o]() -> int {
                ANVIL_CHECK(o->overwrite || !(dir_exists(o->out) || file_exists(o->out)),
                            "--out {}: already exists; choose another directory or pass --overwrite", o->out);
                InferenceSetup l = setup_inference(o->in);
                merge_lora(*l.model);
                const std::string tmp = temp_dir_for(o->out);
                make_dirs(tmp);
                const nlohmann::json extra = {{"anvil_tokenizer", l.tok->kind()},
                                        {"anvil_template", template_name(l.prompt)}};
                write_model_dir(tmp, *l.model, extra);
                l.tok->save(tmp);
                replace_dir(tmp, o->out);
                std::printf("merged %s into %s: %s\n", l.adapter_dir.c_str(), l.base_dir.c_str(), o->out.c_str());
                return 0;
            }};
}

}  // namespace anvil::cli
