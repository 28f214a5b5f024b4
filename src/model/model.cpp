#include "model/model.h"

#include <set>

#include "core/fp8.h"
#include "model/gpt2.h"
#include "model/llama.h"

namespace anvil {

namespace {
const ModelFamily* const kFamilies[] = {&kGpt2Family, &kLlamaFamily, &kMistralFamily, &kQwen2Family};
}

const ModelFamily* find_model_family(const std::string& model_type) {
    for (const ModelFamily* f : kFamilies)
        if (model_type == f->model_type) return f;
    return nullptr;
}

const ModelFamily& model_family(const std::string& model_type) {
    const ModelFamily* f = find_model_family(model_type);
    ANVIL_CHECK(f, "model_type \"{}\": anvil implements {}", model_type, known_model_types());
    return *f;
}

std::string known_model_types() {
    std::string s;
    for (const ModelFamily* f : kFamilies) s += (s.empty() ? "" : ", ") + std::string(f->model_type);
    return s;
}

std::unique_ptr<Model> make_model(Backend& be, const ModelConfig& c, const ModelOptions& o) {
    c.validate("model config");
    return model_family(c.model_type).make(be, c, o);
}

Model::Model(Backend& be, const ModelConfig& c, ModelOptions o)
    : be_(be), config_(c), options_(std::move(o)) {
    reg_.dtype = options_.dtype;
    reg_.store = &store_;
    reg_.tp = options_.tp;
    reg_.int8 = c.int8_weights;
    reg_.fp8 = options_.fp8;
    reg_.fp8_history = options_.fp8 ? options_.fp8_history : 0;
    ANVIL_CHECK(reg_.fp8_history >= 0 && reg_.fp8_history <= Fp8History::kMaxLength,
                "--fp8-history {}: give a length from 1 to {}", options_.fp8_history, Fp8History::kMaxLength);
    ANVIL_CHECK(reg_.fp8_history == 0 || options_.tp.size == 1,
                "--fp8-scaling delayed does not combine with tensor parallelism yet (each rank would keep "
                "the histories of its own slices); use --fp8-scaling current");
    ANVIL_CHECK(!(c.int8_weights && options_.fp8),
                "an int8 model (anvil quantize) does not take FP8 products; "
                "fine-tune the unquantized model with --precision fp8, or use bf16");
    const int K = options_.tp.size;
    if (K == 1) return;
    ANVIL_CHECK(
        !c.int8_weights,
        "--tensor-parallel {}: int8 weights (anvil quantize) do not split over tensor-parallel ranks; use "
        "the unquantized model, or data parallelism",
        K);
    ANVIL_CHECK(options_.tp.reducer && options_.tp.rank >= 0 && options_.tp.rank < K,
                "tensor parallelism over {} ranks needs this rank's place and a reducer", K);
    const auto splits = [K](int n, const char* what) {
        ANVIL_CHECK(n % K == 0,
                    "--tensor-parallel {}: the model's {} {} do not split evenly over {} ranks; use a "
                    "--tensor-parallel that divides {}",
                    K, n, what, K, n);
    };
    splits(c.n_head, "attention heads");
    splits(c.kv_heads(), "key/value heads");
    splits(c.ffn(), "MLP columns");
    ANVIL_CHECK(
        !options_.lora.enabled(),
        "--tensor-parallel {}: LoRA fine-tuning does not combine with tensor parallelism yet; use data "
        "parallelism (leave out --tensor-parallel)",
        K);
}

void Model::allocate_params() {
    std::function<void()> attach;
    if (options_.lora.enabled()) {
        if (options_.lora.targets.empty()) {  // "q_proj,v_proj"
            std::string t = model_family(config_.model_type).default_lora_targets;
            for (size_t i = 0, j; i < t.size(); i = j + 1) {
                j = std::min(t.find(',', i), t.size());
                options_.lora.targets.push_back(t.substr(i, j - i));
            }
        }
        attach = add_lora(reg_, linears(), options_.lora);
    }
    std::set<std::string> frozen(options_.frozen.begin(), options_.frozen.end());
    for (ParamSpec& s : reg_.specs)
        if (frozen.erase(s.name)) s.trainable = false;
    ANVIL_CHECK(frozen.empty(), "cannot freeze \"{}\": the model has no parameter of that name",
                *frozen.begin());
    store_ = ParamStore(be_, reg_.specs);
    if (attach) attach();
    if (reg_.fp8_layers > 0) {  // delayed scaling: every history fresh
        const int F = Fp8History::floats(reg_.fp8_history);
        std::vector<float> fresh(size_t(reg_.fp8_layers) * 3 * size_t(F));
        for (size_t h = 0; h < size_t(reg_.fp8_layers) * 3; h++)
            fp8_history_init(fresh.data() + h * size_t(F), reg_.fp8_history);
        fp8_state_ = be_.alloc(fresh.size() * sizeof(float));
        reg_.fp8_state = {fp8_state_.data(), Shape{reg_.fp8_layers, 3, F}, DType::F32, be_.device()};
        be_.upload(reg_.fp8_state, fresh.data());
    }
}

std::unique_ptr<Activations> Model::make_activations(int max_B, int max_T, ActMode mode) const {
    ANVIL_CHECK(max_B > 0 && max_T > 0, "batch size and sequence length must be positive, got {} and {}",
                max_B, max_T);
    ANVIL_CHECK(max_T <= config_.n_ctx,
                "sequence length {} is longer than the model's context {}; use --seq {} or less", max_T,
                config_.n_ctx, config_.n_ctx);
    ActPlan p(reg_.acts, max_B, max_T, mode, options_.recompute);
    p.add(act::tokens, {}, DType::I32, Keep::Saved, "tokens");
    p.add(act::targets, {}, DType::I32, Keep::Saved, "targets");
    p.add(act::losses, {}, DType::F32, Keep::Saved, "losses");
    if (mode == ActMode::Train && options_.neftune_alpha > 0.0f)
        p.add(act::lengths, {}, DType::I32, Keep::Saved, "lengths");
    if (mode == ActMode::Decode) p.add(act::rows, {2}, DType::I32, Keep::Saved, "rows");
    plan(p);
    return std::make_unique<Activations>(be_, p);
}

int Model::cache_width() const {
    return config_.kv_heads() / options_.tp.size * config_.head_size();  // tensor parallel: this rank's heads
}

std::unique_ptr<KvCache> Model::make_cache(int max_T, int slots, int pages, int page) const {
    return std::make_unique<KvCache>(be_, config_.n_layer, slots, max_T > 0 ? max_T : config_.n_ctx,
                                     cache_width(), options_.dtype, pages, page);
}

size_t Model::cache_page_bytes(int page) const {
    return KvCache::page_bytes(config_.n_layer, cache_width(), options_.dtype, page);
}

size_t Model::cache_slot_bytes(int max_T) const {
    return KvCache::slot_bytes(config_.n_layer, max_T > 0 ? max_T : config_.n_ctx, cache_width(),
                               options_.dtype);
}

void Model::reserve(int max_B, int max_T, bool training) {
    ANVIL_ASSERT(!acts_);
    acts_ = make_activations(max_B, max_T, training ? ActMode::Train : ActMode::Eval);
}

Activations& Model::activations() const {
    ANVIL_CHECK(acts_, "the model has no activations reserved; call reserve() first");
    return *acts_;
}

}  // namespace anvil
