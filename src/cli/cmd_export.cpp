// anvil export gguf: a model (with any LoRA adapter folded in) as one GGUF file for llama.cpp, Ollama and
// LM Studio.
#include <chrono>
#include <filesystem>
#include <memory>

#include "cli/commands.h"
#include "core/version.h"
#include "io/fs.h"
#include "io/json_text.h"
#include "model/lora.h"
#include "runtime/gguf_model.h"
#include "runtime/inference.h"

namespace anvil::cli {

namespace {

// Where the model came from, for general.description: anvil's run record when it has one.
std::string provenance(const InferenceSetup& l) {
    std::string d = "exported by anvil " + std::string(version_string()) + " from " + l.base_dir;
    if (!l.adapter_dir.empty()) d += " with the LoRA adapter " + l.adapter_dir + " merged";
    for (const std::string& dir : {l.adapter_dir, l.base_dir}) {
        if (dir.empty() || !file_exists(dir + "/trainer_state.json")) continue;
        const nlohmann::json t = read_json_file(dir + "/trainer_state.json");
        d += fmt::format("; trained {} steps", t.value("step", 0));
        if (t.contains("data") && t["data"].contains("path"))
            d += " on " + t["data"].value("path", std::string());
        break;
    }
    return d;
}

}  // namespace

Command add_export(CLI::App& app) {
    CLI::App* sub = app.add_subcommand("export", "write a model in another runtime's format");
    sub->require_subcommand(1);
    CLI::App* g = sub->add_subcommand(
        "gguf",
        "one GGUF file for llama.cpp, Ollama, LM Studio and llama-cpp-python: GPT-2 (llama.cpp's gpt2) and "
        "the Llama family (llama, qwen2), the tokenizer and chat template inside");
    struct Opts {
        InferenceOptions in;
        std::string out, dtype = "f16", name, json, base;
        bool overwrite = false;
    };
    auto o = std::make_shared<Opts>();
    g->add_option("--model", o->in.model_dir,
                  "the model directory (or a run directory: its final/, or a GGUF file); the whole model is "
                  "written");
    g->add_option("--adapter", o->in.adapter,
                  "a PEFT LoRA adapter: with --model, folded into the weights; with --base, written alone");
    g->add_option("--base", o->base,
                  "with --adapter: write only the adapter, as llama.cpp's LoRA adapter GGUF (llama-cli -m "
                  "BASE.gguf --lora FILE.gguf), for the base model it was trained on");
    g->add_option("--tokenizer", o->in.tokenizer, "override the model's tokenizer");
    g->add_option("--out", o->out, "the .gguf file to write")->required();
    g->add_option("--dtype", o->dtype,
                  "the weights' type: f32, f16, bf16 or q8_0 (llama.cpp's 8-bit blocks); norms and biases "
                  "stay f32")
        ->capture_default_str()
        ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0"}));
    g->add_option("--name", o->name, "general.name (default: the model's directory, a run's name)");
    g->add_flag("--overwrite", o->overwrite, "replace --out if it exists");
    g->add_option("--threads", o->in.threads, "CPU threads (0 = all cores)")->check(kNonNegative);
    add_json_flag(g, o->json);
    return {
        sub, [o]() -> int {
            ANVIL_CHECK(o->overwrite || !file_exists(o->out),
                        "--out {}: exists; pass --overwrite to replace it", o->out);
            ANVIL_CHECK(o->in.model_dir.empty() != o->base.empty(),
                        "give --model DIR (the whole model) or --base DIR --adapter DIR (the adapter alone)");
            ANVIL_CHECK(o->base.empty() || !o->in.adapter.empty(), "--base {}: give the --adapter to write",
                        o->base);
            const auto t0 = std::chrono::steady_clock::now();
            const bool adapter_only = !o->base.empty();
            if (adapter_only) o->in.model_dir = o->base;
            o->in.device = "cpu";
            InferenceSetup l = setup_inference(o->in);
            GgufExportOptions e;
            e.dtype = o->dtype;
            e.name =
                o->name.empty() ? default_model_name(adapter_only ? l.adapter_dir : l.base_dir) : o->name;
            e.description = provenance(l);
            if (adapter_only) {
                export_gguf_adapter(*l.model, read_peft_config(l.adapter_dir).lora, o->out, e);
            } else {
                if (l.model->has_adapters()) merge_lora(*l.model);
                export_gguf(*l.model, *l.tok, o->out, e);
            }
            const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            const nlohmann::json j = {{"model", l.base_dir}, {"adapter", l.adapter_dir},
                                      {"out", o->out},       {"dtype", o->dtype},
                                      {"name", e.name},      {"bytes", std::filesystem::file_size(o->out)},
                                      {"seconds", secs}};
            emit_result(o->json, j,
                        fmt::format("wrote {} ({}, {:.1f} MB) in {:.1f} s\n", o->out, o->dtype,
                                    double(std::filesystem::file_size(o->out)) / 1e6, secs));
            return 0;
        }};
}

}  // namespace anvil::cli
