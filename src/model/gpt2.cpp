#include "model/gpt2.h"

#include <cmath>
#include <nlohmann/json.hpp>

namespace anvil {

namespace {

std::string layer_prefix(int l) {
    return "transformer.h." + std::to_string(l);
}

// ---- config.json --------------------------------------------------------------------------------------

nlohmann::json to_hf(const ModelConfig& c) {
    return {
        {"architectures", {"GPT2LMHeadModel"}},
        {"model_type", "gpt2"},
        {"n_layer", c.n_layer},
        {"n_head", c.n_head},
        {"n_embd", c.n_embd},
        {"n_positions", c.n_ctx},
        {"n_ctx", c.n_ctx},
        {"n_inner", nullptr},
        {"vocab_size", c.vocab_size},
        {"activation_function", "gelu_new"},
        {"layer_norm_epsilon", 1e-5},
        {"initializer_range", 0.02},
        {"resid_pdrop", 0.0},
        {"embd_pdrop", 0.0},
        {"attn_pdrop", 0.0},
        {"scale_attn_weights", true},
        {"tie_word_embeddings", true},
        {"use_cache", true},
        {"torch_dtype", "float32"},
    };
}

int get_int(const nlohmann::json& j, const char* key, const std::string& path) {
    ANVIL_CHECK(j.contains(key), "{}: config has no \"{}\"; it must be a Hugging Face GPT-2 config.json",
                path, key);
    ANVIL_CHECK(j[key].is_number_integer(), "{}: \"{}\" must be an integer, got {}", path, key,
                j[key].dump());
    const int64_t v = j[key].get<int64_t>();
    ANVIL_CHECK(v > 0 && v < (int64_t(1) << 31), "{}: \"{}\" must be positive, got {}", path, key, v);
    return int(v);
}

// Rejects the GPT-2 variants anvil does not implement, naming the key.
void check_variant(const nlohmann::json& j, const ModelConfig& c, const std::string& path) {
    if (j.contains("activation_function") && j["activation_function"].is_string()) {
        const std::string act = j["activation_function"];
        ANVIL_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh",
                    "{}: activation_function \"{}\" is not supported; anvil implements GPT-2's tanh GELU "
                    "(gelu_new)",
                    path, act);
    }
    if (j.contains("tie_word_embeddings") && j["tie_word_embeddings"].is_boolean())
        ANVIL_CHECK(j["tie_word_embeddings"].get<bool>(), "{}: untied output embeddings are not supported",
                    path);
    if (j.contains("layer_norm_epsilon") && j["layer_norm_epsilon"].is_number())
        ANVIL_CHECK(std::abs(j["layer_norm_epsilon"].get<double>() - 1e-5) < 1e-9,
                    "{}: layer_norm_epsilon {} is not supported; anvil uses GPT-2's 1e-5", path,
                    j["layer_norm_epsilon"].get<double>());
    if (j.contains("n_inner") && !j["n_inner"].is_null())
        ANVIL_CHECK(j["n_inner"] == 4 * c.n_embd, "{}: n_inner {} is not supported; anvil uses 4 * n_embd",
                    path, j["n_inner"].dump());
}

ModelConfig from_hf(const nlohmann::json& j, const std::string& path) {
    ModelConfig c;
    c.model_type = "gpt2";
    c.n_layer = get_int(j, "n_layer", path);
    c.n_head = get_int(j, "n_head", path);
    c.n_embd = get_int(j, "n_embd", path);
    c.n_ctx = get_int(j, j.contains("n_positions") ? "n_positions" : "n_ctx", path);
    c.vocab_size = get_int(j, "vocab_size", path);
    check_variant(j, c, path);
    return c;
}

int64_t num_params(const ModelConfig& c) {
    const int64_t C = c.n_embd, L = c.n_layer;
    const int64_t per_layer =
        2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C + (C * 4 * C + 4 * C) + (4 * C * C + C);
    return int64_t(c.vocab_size) * C + int64_t(c.n_ctx) * C + L * per_layer + 2 * C;
}

int64_t position_params(const ModelConfig& c) {
    return int64_t(c.n_ctx) * c.n_embd;
}

std::unique_ptr<Model> make(Backend& be, const ModelConfig& c, const ModelOptions& o) {
    return std::make_unique<Gpt2Model>(be, c, o);
}

constexpr double kStd = 0.02;

}  // namespace

// PEFT's default target for GPT-2 is the fused q, k, v projection
const ModelFamily kGpt2Family = {"gpt2", from_hf, to_hf, num_params, position_params, make, "c_attn"};

// ---- the model ----------------------------------------------------------------------------------------

Gpt2Model::Gpt2Model(Backend& be, const ModelConfig& c, const ModelOptions& o) : DecoderModel(be, c, o) {
    emb_ = Embedding(reg_, "transformer.wte.weight", "transformer.wpe.weight", c.vocab_size, c.n_ctx,
                     c.n_embd, kStd);
    const double proj_std =
        kStd / std::sqrt(2.0 * c.n_layer);  // GPT-2's scaled init of the residual projections
    for (int l = 0; l < c.n_layer; l++) {
        const std::string h = layer_prefix(l);
        blocks_.push_back(std::make_unique<Gpt2Block>(
            reg_, h, l, c.n_embd, [&] { return Norm(reg_, h + ".ln_1", c.n_embd, l, true); },
            [&] { return Attention(reg_, h + ".attn", c.n_embd, c.n_head, l, kStd, proj_std); },
            [&] { return Norm(reg_, h + ".ln_2", c.n_embd, l, true); },
            [&] { return Mlp(reg_, h + ".mlp", c.n_embd, 4 * c.n_embd, l, kStd, proj_std); }));
    }
    norm_ = Norm(reg_, "transformer.ln_f", c.n_embd, -1, false);
    lm_head_ = Linear::tied(reg_, emb_.token_weight(), WLayout::OutIn, emb_.token_scale());
    allocate_params();
}

std::string Gpt2Model::canonical_name(const std::string& file_name) const {
    if (store_.find(file_name) == ParamStore::npos &&
        store_.find("transformer." + file_name) != ParamStore::npos)
        return "transformer." + file_name;
    return file_name;
}

bool Gpt2Model::ignorable_tensor(const std::string& n) const {
    return n.ends_with(".attn.bias") || n.ends_with(".attn.masked_bias") || n == "lm_head.weight";
}

}  // namespace anvil
