// What several subcommands share: number validators, model-directory resolution, the --json flag and
// --config files.
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "core/sizes.h"
#include "data/chat.h"
#include "data/tokenizer.h"
#include "io/fs.h"
#include "io/json_text.h"
#include "model/model_io.h"
#include "runtime/inference.h"

namespace anvil::cli {

namespace {
CLI::Validator number_check(bool allow_zero) {
    return CLI::Validator(
        [allow_zero](std::string& v) -> std::string {
            char* end = nullptr;
            const double x = std::strtod(v.c_str(), &end);
            if (end == v.c_str() || *end != '\0') return "must be a number, got \"" + v + "\"";
            if (allow_zero ? x < 0 : x <= 0)
                return std::string(allow_zero ? "must be zero or more" : "must be positive") + ", got " + v;
            return {};
        },
        allow_zero ? "NUMBER >= 0" : "NUMBER > 0");
}
}  // namespace

const CLI::Validator kPositive = number_check(false);
const CLI::Validator kNonNegative = number_check(true);

CLI::Option* add_template_flag(CLI::App* sub, std::string& dest, const std::string& default_note) {
    return sub
        ->add_option(
            "--template,--chat-template", dest,
            "how instruction {\"instruction\",\"input\",\"output\"} and chat {\"messages\"} records are "
            "rendered: alpaca, compact, llama3 (Llama 3 header tokens), chatml (<|im_start|>), "
            "llama2 (Llama 2 Chat's [INST] with <<SYS>>), mistral (Mistral Instruct's [INST], spaced as the "
            "tokenizer's chat_template), zephyr (TinyLlama-Chat's <|user|>) or auto (llama3 or chatml when "
            "the tokenizer has their special tokens, llama2, mistral or zephyr when its chat_template is "
            "theirs, "
            "mistral also for [INST] control tokens, else alpaca); " +
                default_note)
        ->check(
            CLI::IsMember({"auto", "alpaca", "compact", "llama3", "chatml", "llama2", "mistral", "zephyr"}));
}

void ModelFlags::add(CLI::App* sub) {
    sub->add_option(
           "--model", o.model_dir,
           "model directory (or a run directory: its final/; a LoRA run's adapter loads on its base)")
        ->required();
    sub->add_option("--adapter", o.adapter, "a PEFT LoRA adapter directory to apply to the model");
    sub->add_option("--tokenizer", o.tokenizer, "override the checkpoint's tokenizer");
    add_template_flag(sub, o.prompt_template, "default: the one the model was trained with, else auto");
    sub->add_option("--device", o.device,
                    "cpu, cuda, or auto: CUDA when a usable GPU is visible (anvil doctor), else the CPU")
        ->capture_default_str()
        ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
    sub->add_option("--threads", o.threads, "CPU threads (0 = all cores)")->check(kNonNegative);
    sub->add_option("--precision", o.precision,
                    "fp32, bf16 or fp16: the model's tensors on CUDA; on the CPU, bf16 keeps f32 tensors and "
                    "multiplies the linear layers in bf16 (oneDNN, as PyTorch's CPU autocast)")
        ->capture_default_str()
        ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
}

std::string default_model_name(const std::string& dir) {
    std::filesystem::path p = std::filesystem::path(dir).lexically_normal();
    if (p.filename().empty()) p = p.parent_path();
    const std::string base = p.filename().string();
    if ((base == "final" || base.rfind("checkpoint-", 0) == 0) && !p.parent_path().filename().empty())
        return p.parent_path().filename().string();
    return base.empty() ? "model" : base;
}

CLI::Option* add_json_flag(CLI::App* sub, std::string& dest) {
    // A value is optional: bare --json stores "-" (stdout).
    return sub
        ->add_option("--json", dest,
                     "print the result as JSON instead of text; --json FILE prints the text and writes the "
                     "JSON to FILE")
        ->expected(0, 1)
        ->default_str("-")
        ->type_name("[FILE]");
}

void emit_result(const std::string& json_dest, const nlohmann::json& j, const std::string& text) {
    if (json_dest == "-") {
        std::printf("%s\n", json_text(j, 2).c_str());
        return;
    }
    std::printf("%s", text.c_str());
    if (!json_dest.empty()) write_file_atomic(json_dest, json_text(j, 2) + "\n");
}

void OutputFlags::add(CLI::App* sub, int& threads, const std::string& out_help) {
    sub->add_option("--out", out, out_help)->required();
    sub->add_option("--max-shard-size", max_shard,
                    "a model directory's largest weight file; larger models are sharded")
        ->capture_default_str();
    sub->add_flag("--overwrite", overwrite, "replace --out if it exists");
    sub->add_option("--threads", threads, "CPU threads (0 = all cores)")->check(kNonNegative);
}

DType weight_dtype(const std::string& name) {
    return name == "bf16" ? DType::BF16 : name == "f16" ? DType::F16 : DType::F32;
}

void OutputFlags::check_out() const {
    ANVIL_CHECK(overwrite || !(dir_exists(out) || file_exists(out)),
                "--out {}: already exists; choose another path or pass --overwrite", out);
}

void OutputFlags::write(const Model& model, const nlohmann::json& extra, DType dtype,
                        const std::function<void(const std::string&)>& write_tokenizer) const {
    const SaveFormat format{dtype, parse_bytes(max_shard, "--max-shard-size")};
    const std::string tmp = temp_dir_for(out);
    make_dirs(tmp);
    write_model_dir(tmp, model, extra, {}, format);
    write_tokenizer(tmp);
    replace_dir(tmp, out);
}

void OutputFlags::save(const Model& model, const Tokenizer& tok, const std::string& template_name,
                       DType dtype) const {
    write(model, {{"anvil_tokenizer", tok.kind()}, {"anvil_template", template_name}}, dtype,
          [&](const std::string& dir) { tok.save(dir); });
}

void OutputFlags::save(const Model& model, const InferenceSetup& from, DType dtype) const {
    if (from.tok) return save(model, *from.tok, template_name(from.prompt), dtype);
    write(model, {{"anvil_template", from.template_setting}}, dtype, [&](const std::string& dir) {
        for (const std::string& f : tokenizer_files_in(from.base_dir))
            write_file_atomic(dir + "/" + f, read_file(from.base_dir + "/" + f));
    });
}

CLI::Option* add_config_flag(CLI::App* sub, std::string& dest) {
    return sub
        ->add_option(
            "--config", dest,
            "read flags from a JSON file, {\"layers\": 12, \"lr\": 6e-4, \"lr-schedule\": \"wsd\"} (a "
            "flag's name without the dashes); a flag given on the command line overrides the file's")
        ->check(CLI::ExistingFile);
}

int apply_config_file(CLI::App& sub, const std::string& path) {
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(read_file(path));
    } catch (const nlohmann::json::parse_error& e) {
        fail("--config {}: not valid JSON ({})", path, e.what());
    }
    ANVIL_CHECK(j.is_object(), "--config {}: expected a JSON object of flags, {{\"flag\": value, ...}}",
                path);
    int applied = 0;
    for (const auto& [key, value] : j.items()) {
        if (key.starts_with('#')) continue;  // a comment: {"#": "what this recipe is"}
        std::string name = key;
        std::replace(name.begin(), name.end(), '_', '-');
        const bool meta = name == "config" || name == "help" || name == "help-all";
        CLI::Option* opt = meta ? nullptr : sub.get_option_no_throw("--" + name);
        ANVIL_CHECK(opt, "--config {}: \"{}\" is not a flag of `anvil {}` (anvil {} --help lists them)", path,
                    key, sub.get_name(), sub.get_name());
        if (opt->get_expected_max() == 0)  // a flag: true or false
            ANVIL_CHECK(value.is_boolean(), "--config {}: \"{}\" is a flag: give true or false, not {}", path,
                        key, value.dump());
        // a flag of several values (--in FILES...) takes a list
        const bool many = opt->get_expected_max() > 1 && value.is_array();
        std::vector<std::string> v;
        for (const nlohmann::json& x : many ? value : nlohmann::json::array({value})) {
            if (x.is_string())
                v.push_back(x.get<std::string>());
            else if (x.is_boolean() || x.is_number())
                v.push_back(x.dump());
            else
                fail("--config {}: \"{}\" must be a string, a number or true/false{}, not {}", path, key,
                     opt->get_expected_max() > 1 ? " (or a list of them)" : "", value.dump());
        }
        if (opt->count() > 0) continue;  // the command line's own value wins
        try {
            for (const std::string& x : v) opt->add_result(x);
            opt->run_callback();
        } catch (const CLI::Error& e) {
            fail("--config {}: \"{}\": {}", path, key, e.what());
        }
        applied++;
    }
    return applied;
}

}  // namespace anvil::cli
