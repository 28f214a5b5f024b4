#include "runtime/inference.h"

#include "io/fs.h"
#include "io/json_text.h"
#include "model/lora.h"
#include "model/model_io.h"
#include "runtime/run_dir.h"

namespace anvil {

Device parse_device(const std::string& name) {
    if (name == "cpu") return Device::CPU;
    if (name == "cuda") return Device::CUDA;
    if (name == "auto") return cuda_available() ? Device::CUDA : Device::CPU;
    fail("--device {}: unknown device; use cpu, cuda or auto", name);
}

BackendOptions backend_options(const std::string& device, int threads, const std::string& attention,
                               int gpu) {
    BackendOptions bo;
    bo.device = parse_device(device);
    bo.threads = threads;
    bo.attention = parse_attention(attention);
    bo.device_id = gpu;
    return bo;
}

std::unique_ptr<Backend> make_run_backend(const std::string& device, int threads,
                                          const std::string& attention, int gpu) {
    return make_backend(backend_options(device, threads, attention, gpu));
}

void enable_cpu_bf16_products(Backend& be) {
    ANVIL_CHECK(be.set_autocast(DType::BF16),
                "--precision bf16 on the CPU multiplies through oneDNN, which this build of anvil lacks; "
                "install libdnnl-dev and rebuild (make), or use --precision fp32");
}

namespace {

// --precision for a model that runs: the model's dtype, the CPU's bf16 products switched on.
DType inference_dtype(const std::string& precision, Backend& be) {
    DType dt;
    ANVIL_CHECK(precision != "fp8" && dtype_from_precision(precision, &dt),
                "--precision {}: a model runs in fp32, bf16 or fp16", precision);
    if (be.device() == Device::CUDA || dt == DType::F32) return dt;
    ANVIL_CHECK(dt == DType::BF16,
                "--precision {}: the CPU backend runs in fp32 or bf16; use one of them, or "
                "--device cuda",
                precision);
    enable_cpu_bf16_products(be);
    return DType::F32;
}

}  // namespace

InferenceSetup setup_inference(const InferenceOptions& o) {
    InferenceSetup l;
    std::string dir = resolve_model_dir(o.model_dir), adapter = o.adapter;
    if (!adapter.empty()) adapter = resolve_model_dir(adapter, "--adapter");  // a LoRA run: its final/
    if (is_adapter_dir(dir)) {  // a LoRA run's directory: its base, plus the adapter
        ANVIL_CHECK(adapter.empty(),
                    "--model {} is itself an adapter; give its base with --model and it with "
                    "--adapter",
                    dir);
        adapter = dir;
        dir = resolve_model_dir(read_peft_config(adapter).base_model);
    }
    nlohmann::json raw;
    const ModelConfig cfg = read_model_config(dir, &raw);
    if (!o.tokenizer.empty())
        l.tok = make_tokenizer(o.tokenizer);
    else if (!o.weights_only || checkpoint_names_tokenizer(dir, raw))
        l.tok = tokenizer_for_checkpoint(dir, raw);
    std::string tmpl = raw.value("anvil_template", std::string("auto"));
    if (!adapter.empty() && file_exists(adapter + "/trainer_state.json"))  // the template it was tuned with
        tmpl = read_json_file(adapter + "/trainer_state.json")["options"].value("prompt_template", tmpl);
    l.template_setting = !o.prompt_template.empty() ? o.prompt_template : tmpl;
    if (l.tok) {
        l.prompt = choose_template(l.template_setting, *l.tok);
        ANVIL_CHECK(l.tok->vocab_size() <= cfg.vocab_size,
                    "--tokenizer: {} ids do not fit the model's vocabulary of {}", l.tok->vocab_size(),
                    cfg.vocab_size);
    }
    l.backend = make_run_backend(o.device, o.threads, "auto");
    ModelOptions mo;
    mo.dtype = inference_dtype(o.precision, *l.backend);
    if (!adapter.empty()) mo.lora = read_peft_config(adapter).lora;
    l.model = make_model(*l.backend, cfg, mo);
    if (!adapter.empty()) read_peft_config(adapter, l.model.get());  // the layout check needs the model
    load_model_weights(dir, *l.model);
    if (!adapter.empty()) load_peft_weights(adapter, *l.model);
    l.base_dir = dir;
    l.adapter_dir = adapter;
    return l;
}

}  // namespace anvil
