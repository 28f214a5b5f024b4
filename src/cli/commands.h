// Subcommands of the `anvil` binary. Each registers its flags on the CLI11 app and returns the function
// that runs it once parsing succeeded.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "runtime/inference.h"
#include "train/options.h"

namespace anvil::cli {

// A caller of the command line other than the binary's main() (the Python layer): errors, bad flags among
// them, are thrown to it (InputError for what was given) instead of printed, and a training run reports to
// its hooks.
struct Embedding {
    bool throw_errors = false;
    std::shared_ptr<const TrainHooks> train_hooks;
};
// The anvil command line on `args` (without the program's name: {"train", "--steps", "10"}): its exit status.
int run_anvil(const std::vector<std::string>& args, const Embedding& embed = {});

struct Command {
    CLI::App* app;             // the subcommand
    std::function<int()> run;  // runs it after a successful parse
};

Command add_train(CLI::App& app, std::shared_ptr<const TrainHooks> hooks = nullptr);
Command add_eval(CLI::App& app);
Command add_compare(CLI::App& app);
Command add_generate(CLI::App& app);
Command add_tokenize(CLI::App& app);
Command add_tokenizer(CLI::App& app);
Command add_data(CLI::App& app);
Command add_dedup(CLI::App* data);         // `data dedup`, under add_data's `data`
Command add_pseudo_label(CLI::App* data);  // `data pseudo-label`
Command add_filter(CLI::App* data);        // `data filter`
Command add_synth(CLI::App* data);         // `data synth`
Command add_augment(CLI::App* data);       // `data augment`
Command add_doctor(CLI::App& app);
Command add_bench(CLI::App& app);
Command add_plot(CLI::App& app);
Command add_lora(CLI::App& app);
Command add_quantize(CLI::App& app);
Command add_convert(CLI::App& app);
Command add_export(CLI::App& app);
Command add_plan(CLI::App& app);
Command add_serve(CLI::App& app);
// `train`: the flags a sweep's grid may vary
Command add_sweep(CLI::App& app, const CLI::App& train);

// A new model's shape: --arch, --layers, --heads, --dim, --kv-heads, --ffn-dim, --rope-theta, --norm-eps,
// --tie-embeddings, --vocab, --seq (train's, and plan's).
void add_model_flags(CLI::App* sub, TrainOptions& o);

// Validators with messages a person can read (CLI11's numeric ranges print the type's limits).
extern const CLI::Validator kPositive;     // "must be a positive number"
extern const CLI::Validator kNonNegative;  // "must be zero or more"

// --template / --chat-template NAME: how instruction and chat records are rendered (data/chat.h).
CLI::Option* add_template_flag(CLI::App* sub, std::string& dest, const std::string& default_note);

// A model's name for users (the served model, a GGUF's general.name): a run's final/ or checkpoint-N/ is
// named after the run directory, any other model directory after itself.
std::string default_model_name(const std::string& dir);

// The flags of the commands that load a trained model (eval, generate, serve): --model, --adapter,
// --tokenizer, --template, --device, --threads, --precision.
struct ModelFlags {
    InferenceOptions o;
    void add(CLI::App* sub);
    InferenceSetup load() const { return setup_inference(o); }
};

// The flags of the commands that write a model (lora merge, quantize, convert): --out, --max-shard-size,
// --overwrite, --threads (into `threads`).
struct OutputFlags {
    std::string out, max_shard = "5G";
    bool overwrite = false;
    void add(CLI::App* sub, int& threads, const std::string& out_help);
    // Refuses an --out that exists unless --overwrite says to replace it.
    void check_out() const;
    // Writes `model` with `tok`'s files and `template_name` as a model directory at --out: into a temporary
    // directory renamed over it, so nothing is left half-written.
    void save(const Model& model, const Tokenizer& tok, const std::string& template_name, DType dtype) const;
    // The same for a model made from a loaded one (`from`): with its tokenizer, or, when it has none (a
    // weights-only load of a directory without tokenizer files), whatever tokenizer files its directory holds
    // and its template setting.
    void save(const Model& model, const InferenceSetup& from, DType dtype) const;

private:
    // Both: the model directory with config.json's `extra` keys, then write_tokenizer(tmp), then the rename.
    void write(const Model& model, const nlohmann::json& extra, DType dtype,
               const std::function<void(const std::string&)>& write_tokenizer) const;
};
// --dtype f32|bf16|f16 of the written weights.
DType weight_dtype(const std::string& name);

// --config FILE (every command has it, app.cpp): a JSON object of the subcommand's flags, {"layers": 12,
// "lr": 6e-4, "lr-schedule": "wsd", "tie-embeddings": true} (a key is a flag's long name without the dashes,
// '_' for '-' allowed), applied as if given on the command line, except where the command line gave that flag
// itself. A key that names no flag, a value that is not a string, number or true/false, or one the flag
// refuses is an error naming the file and the key; a flag of several values takes a list; a key starting
// with '#' is a comment. Returns how many flags it set.
CLI::Option* add_config_flag(CLI::App* sub, std::string& dest);
int apply_config_file(CLI::App& sub, const std::string& path);

// The --json flag every command with a machine-readable result has: bare `--json` prints JSON to stdout
// instead of the text; `--json FILE` prints the text and writes the JSON to FILE (atomically). `dest` is
// "" (not given), "-" (stdout) or the file.
CLI::Option* add_json_flag(CLI::App* sub, std::string& dest);
// Prints `text` or the JSON, and writes the file, as `dest` says.
void emit_result(const std::string& dest, const nlohmann::json& j, const std::string& text);

}  // namespace anvil::cli
