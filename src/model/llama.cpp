#include "model/llama.h"

#include <cmath>
#include <nlohmann/json.hpp>

namespace anvil {

namespace {

constexpr double kStd = 0.02;  // initializer_range

std::string layer_prefix(int l) {
    return "model.layers." + std::to_string(l);
}

// ---- config.json --------------------------------------------------------------------------------------

// transformers' class for each model_type of the family
const char* architecture(const std::string& type) {
    return type == "mistral" ? "MistralForCausalLM"
           : type == "qwen2" ? "Qwen2ForCausalLM"
                             : "LlamaForCausalLM";
}

nlohmann::json to_hf(const ModelConfig& c) {
    nlohmann::json scaling = nullptr;
    if (c.rope_scaling.type == "llama3")
        scaling = {{"rope_type", "llama3"},
                   {"factor", c.rope_scaling.factor},
                   {"low_freq_factor", c.rope_scaling.low_freq_factor},
                   {"high_freq_factor", c.rope_scaling.high_freq_factor},
                   {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
    else if (c.rope_scaling.type == "linear")
        scaling = {{"rope_type", "linear"}, {"factor", c.rope_scaling.factor}};
    nlohmann::json j = {
        {"architectures", {architecture(c.model_type)}},
        {"model_type", c.model_type},
        {"hidden_size", c.n_embd},
        {"intermediate_size", c.ffn()},
        {"num_hidden_layers", c.n_layer},
        {"num_attention_heads", c.n_head},
        {"num_key_value_heads", c.kv_heads()},
        {"head_dim", c.head_size()},
        {"hidden_act", "silu"},
        {"max_position_embeddings", c.hf_max_positions > 0 ? c.hf_max_positions : c.n_ctx},
        {"rms_norm_eps", c.norm_eps},
        {"rope_theta", c.rope_theta},
        {"rope_scaling", scaling},
        {"vocab_size", c.vocab_size},
        {"tie_word_embeddings", c.tie_embeddings},
        {"attention_dropout", 0.0},
        {"initializer_range", kStd},
        {"use_cache", true},
        {"torch_dtype", "float32"},
    };
    if (c.model_type == "llama") {
        j["attention_bias"] = c.qkv_bias;
        j["mlp_bias"] = c.mlp_bias;
        j["pretraining_tp"] = 1;
    } else if (c.model_type == "mistral") {
        j["sliding_window"] = c.hf_max_positions > 0 ? nlohmann::json(c.n_ctx) : nlohmann::json(nullptr);
    } else {  // qwen2: q, k and v always have biases
        j["use_sliding_window"] = false;
        j["sliding_window"] = nullptr;
        j["max_window_layers"] = c.n_layer;
    }
    return j;
}

int get_int(const nlohmann::json& j, const char* key, const std::string& path) {
    ANVIL_CHECK(j.contains(key) && !j[key].is_null(),
                "{}: config has no \"{}\"; a Llama config.json needs it", path, key);
    ANVIL_CHECK(j[key].is_number_integer(), "{}: \"{}\" must be an integer, got {}", path, key,
                j[key].dump());
    const int64_t v = j[key].get<int64_t>();
    ANVIL_CHECK(v > 0 && v < (int64_t(1) << 31), "{}: \"{}\" must be positive, got {}", path, key, v);
    return int(v);
}

double get_number(const nlohmann::json& j, const char* key, double dflt, const std::string& path) {
    if (!j.contains(key) || j[key].is_null()) return dflt;
    ANVIL_CHECK(j[key].is_number(), "{}: \"{}\" must be a number, got {}", path, key, j[key].dump());
    return j[key].get<double>();
}

// `key`: rope_scaling (transformers 4) or rope_parameters (transformers 5, which holds rope_theta too).
RopeScaling rope_scaling(const nlohmann::json& j, const char* key, const std::string& path) {
    RopeScaling s;
    if (!j.contains(key) || j[key].is_null()) return s;
    const nlohmann::json& r = j[key];
    ANVIL_CHECK(r.is_object(), "{}: \"{}\" must be an object or null", path, key);
    const std::string type = r.value("rope_type", r.value("type", std::string("default")));
    if (type == "default") return s;
    ANVIL_CHECK(type == "llama3" || type == "linear",
                "{}: {} type \"{}\" is not supported; anvil implements \"llama3\" and \"linear\"", path, key,
                type);
    s.type = type;
    s.factor = get_number(r, "factor", 0.0, path);
    ANVIL_CHECK(s.factor > 0, "{}: {} needs a positive \"factor\"", path, key);
    if (type == "llama3") {
        s.low_freq_factor = get_number(r, "low_freq_factor", 1.0, path);
        s.high_freq_factor = get_number(r, "high_freq_factor", 4.0, path);
        s.original_max_position_embeddings = get_int(r, "original_max_position_embeddings", path);
        ANVIL_CHECK(s.high_freq_factor > s.low_freq_factor,
                    "{}: {} high_freq_factor must exceed low_freq_factor", path, key);
    }
    return s;
}

// The keys every family of the Llama layout has.
ModelConfig from_hf(const nlohmann::json& j, const std::string& path) {
    ModelConfig c;
    c.model_type = "llama";
    c.n_layer = get_int(j, "num_hidden_layers", path);
    c.n_head = get_int(j, "num_attention_heads", path);
    c.n_kv_head = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                      ? get_int(j, "num_key_value_heads", path)
                      : c.n_head;
    c.n_embd = get_int(j, "hidden_size", path);
    c.ffn_dim = get_int(j, "intermediate_size", path);
    c.n_ctx = get_int(j, "max_position_embeddings", path);
    c.vocab_size = get_int(j, "vocab_size", path);
    if (j.contains("head_dim") && !j["head_dim"].is_null())
        c.head_dim = get_int(j, "head_dim", path);
    else
        ANVIL_CHECK(c.n_embd % c.n_head == 0,
                    "{}: hidden_size {} does not divide into num_attention_heads {}", path, c.n_embd,
                    c.n_head);
    if (c.head_dim == c.n_embd / c.n_head && c.n_embd % c.n_head == 0) c.head_dim = 0;  // the default
    ANVIL_CHECK(c.n_head % c.n_kv_head == 0,
                "{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", path, c.n_head,
                c.n_kv_head);
    if (c.n_kv_head == c.n_head) c.n_kv_head = 0;
    c.rope_theta = get_number(j, "rope_theta", 10000.0, path);
    const bool v5 =
        j.contains("rope_parameters") && j["rope_parameters"].is_object();  // transformers 5's form
    if (v5) c.rope_theta = get_number(j["rope_parameters"], "rope_theta", c.rope_theta, path);
    c.norm_eps = get_number(j, "rms_norm_eps", 1e-6, path);
    c.tie_embeddings = j.value("tie_word_embeddings", false);
    c.rope_scaling = rope_scaling(j, v5 ? "rope_parameters" : "rope_scaling", path);
    const std::string act = j.value("hidden_act", std::string("silu"));
    ANVIL_CHECK(act == "silu", "{}: hidden_act \"{}\" is not supported; Llama's MLP uses silu", path, act);
    return c;
}

bool get_bool(const nlohmann::json& j, const char* key, const std::string& path) {
    if (!j.contains(key) || j[key].is_null()) return false;
    ANVIL_CHECK(j[key].is_boolean(), "{}: \"{}\" must be true or false, got {}", path, key, j[key].dump());
    return j[key].get<bool>();
}

// The window, or 0 when there is none (null, absent, or off).
int sliding_window(const nlohmann::json& j, const std::string& path) {
    if (!j.contains("sliding_window") || j["sliding_window"].is_null()) return 0;
    return get_int(j, "sliding_window", path);
}

ModelConfig llama_from_hf(const nlohmann::json& j, const std::string& path) {
    ModelConfig c = from_hf(j, path);
    c.qkv_bias = c.o_bias = get_bool(j, "attention_bias", path);
    c.mlp_bias = get_bool(j, "mlp_bias", path);
    return c;
}

// Mistral: Llama's layout, no biases, and (Mistral 7B v0.1) attention over a sliding window of the last
// sliding_window positions. Within the window that is ordinary causal attention, so a shorter window is
// the context anvil runs the model with.
ModelConfig mistral_from_hf(const nlohmann::json& j, const std::string& path) {
    ModelConfig c = from_hf(j, path);
    c.model_type = "mistral";
    const int w = sliding_window(j, path);
    if (w > 0 && w < c.n_ctx) {
        c.hf_max_positions = c.n_ctx;
        c.n_ctx = w;
    }
    return c;
}

// Qwen2: Llama's layout with biases on q, k and v.
void qwen2_new(ModelConfig& c) {
    c.qkv_bias = true;
}

ModelConfig qwen2_from_hf(const nlohmann::json& j, const std::string& path) {
    ModelConfig c = from_hf(j, path);
    c.model_type = "qwen2";
    ANVIL_CHECK(
        !get_bool(j, "use_sliding_window", path),
        "{}: \"use_sliding_window\": true is not supported (anvil attends to every earlier position in "
        "every layer); set it to false, as the released Qwen2 and Qwen2.5 models have it",
        path);
    qwen2_new(c);
    return c;
}

int64_t num_params(const ModelConfig& c) {
    const int64_t C = c.n_embd, QC = int64_t(c.n_head) * c.head_size(),
                  KC = int64_t(c.kv_heads()) * c.head_size();
    const int64_t per_layer = 2 * C + C * QC + 2 * C * KC + QC * C + 3 * C * c.ffn() +
                              (c.qkv_bias ? QC + 2 * KC : 0) + (c.o_bias ? C : 0) +
                              (c.mlp_bias ? 2 * c.ffn() + C : 0);
    return int64_t(c.vocab_size) * C * (c.tie_embeddings ? 1 : 2) + c.n_layer * per_layer + C;
}

int64_t position_params(const ModelConfig&) {
    return 0;  // rotary: nothing learned
}

std::unique_ptr<Model> make(Backend& be, const ModelConfig& c, const ModelOptions& o) {
    return std::make_unique<LlamaModel>(be, c, o);
}

// A family in Llama's layout: its own config.json reading (and --arch defaults), the rest shared; PEFT's
// default targets are the query and value projections for all of them.
constexpr ModelFamily llama_layout(const char* type,
                                   ModelConfig (*read)(const nlohmann::json&, const std::string&),
                                   void (*new_model)(ModelConfig&) = nullptr) {
    return {type, read, to_hf, num_params, position_params, make, "q_proj,v_proj", new_model};
}

}  // namespace

const ModelFamily kLlamaFamily = llama_layout("llama", llama_from_hf);
const ModelFamily kMistralFamily = llama_layout("mistral", mistral_from_hf);
const ModelFamily kQwen2Family = llama_layout("qwen2", qwen2_from_hf, qwen2_new);

// ---- the model ----------------------------------------------------------------------------------------

LlamaModel::LlamaModel(Backend& be, const ModelConfig& c, const ModelOptions& o) : DecoderModel(be, c, o) {
    emb_ = Embedding(reg_, "model.embed_tokens.weight", "", c.vocab_size, c.n_ctx, c.n_embd, kStd);
    const float eps = float(c.norm_eps);
    for (int l = 0; l < c.n_layer; l++) {
        const std::string h = layer_prefix(l);
        blocks_.push_back(std::make_unique<LlamaBlock>(
            reg_, h, l, c.n_embd,
            [&] { return Norm(reg_, h + ".input_layernorm", c.n_embd, l, true, NormKind::Rms, eps); },
            [&] {
                return RotaryAttention(reg_, h + ".self_attn", c.n_embd, c.n_head, c.kv_heads(),
                                       c.head_size(), l, kStd, c.qkv_bias, c.o_bias);
            },
            [&] {
                return Norm(reg_, h + ".post_attention_layernorm", c.n_embd, l, true, NormKind::Rms, eps);
            },
            [&] { return GatedMlp(reg_, h + ".mlp", c.n_embd, c.ffn(), l, kStd, c.mlp_bias); }));
    }
    norm_ = Norm(reg_, "model.norm", c.n_embd, -1, false, NormKind::Rms, float(c.norm_eps));
    lm_head_ = c.tie_embeddings ? Linear::tied(reg_, emb_.token_weight(), WLayout::OutIn, emb_.token_scale())
                                : Linear(reg_, "lm_head", c.n_embd, c.vocab_size, WLayout::OutIn, false,
                                         {Init::Normal, kStd}, -1);
    allocate_params();
    const std::vector<float> inv = rope_inv_freq(c.head_size(), c.rope_theta, c.rope_scaling);
    TensorTable t;
    t.add("inv_freq", {int64_t(inv.size())}, DType::F32);
    rope_ = Arena(be_, t);
    be_.upload(rope_[0], inv.data());
    for (auto& b : blocks_) static_cast<LlamaBlock&>(*b).mixer.set_rope(rope_[0]);
}

bool LlamaModel::ignorable_tensor(const std::string& n) const {
    // rotary buffers some checkpoints carry; a tied head written out anyway
    return n.ends_with(".rotary_emb.inv_freq") || (config_.tie_embeddings && n == "lm_head.weight");
}

}  // namespace anvil
