#include "model/config.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace anvil {

int64_t GPTConfig::num_params() const {
    const int64_t C = n_embd, L = n_layer;
    const int64_t per_layer =
        2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C + (C * 4 * C + 4 * C) + (4 * C * C + C);
    return int64_t(vocab_size) * C + int64_t(n_ctx) * C + L * per_layer + 2 * C;
}

double GPTConfig::flops_per_token(int T) const {
    const double N = double(num_params() - int64_t(n_ctx) * n_embd);
    return 6.0 * N + 12.0 * n_layer * double(n_embd) * T;
}

void GPTConfig::validate(const std::string& where) const {
    ANVIL_CHECK(n_layer > 0, "{}: the number of layers must be positive, got {}", where, n_layer);
    ANVIL_CHECK(n_head > 0, "{}: the number of heads must be positive, got {}", where, n_head);
    ANVIL_CHECK(n_embd > 0, "{}: the width must be positive, got {}", where, n_embd);
    ANVIL_CHECK(n_ctx > 0, "{}: the context length must be positive, got {}", where, n_ctx);
    ANVIL_CHECK(vocab_size > 0, "{}: the vocabulary size must be positive, got {}", where, vocab_size);
    ANVIL_CHECK(n_embd % n_head == 0,
                "{}: width {} does not divide into {} heads; pick a width that is a "
                "multiple of the head count",
                where, n_embd, n_head);
    ANVIL_CHECK(n_layer <= 1024 && n_embd <= 65536 && n_ctx <= 1 << 20 && vocab_size <= 1 << 24,
                "{}: model size out of range ({})", where, str());
}

std::string GPTConfig::str() const {
    return fmt::format("{} layers, {} heads, width {}, context {}, vocab {}", n_layer, n_head, n_embd, n_ctx,
                       vocab_size);
}

nlohmann::json config_to_hf_json(const GPTConfig& c, const nlohmann::json& extra) {
    nlohmann::json j = {
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
    for (auto it = extra.begin(); it != extra.end(); ++it) j[it.key()] = it.value();
    return j;
}

namespace {
int get_int(const nlohmann::json& j, const char* key, const std::string& path) {
    ANVIL_CHECK(j.contains(key), "{}: config has no \"{}\"; it must be a Hugging Face GPT-2 config.json",
                path, key);
    ANVIL_CHECK(j[key].is_number_integer(), "{}: \"{}\" must be an integer, got {}", path, key,
                j[key].dump());
    const int64_t v = j[key].get<int64_t>();
    ANVIL_CHECK(v > 0 && v < (int64_t(1) << 31), "{}: \"{}\" must be positive, got {}", path, key, v);
    return int(v);
}
}  // namespace

GPTConfig config_from_hf_json(const nlohmann::json& j, const std::string& path) {
    ANVIL_CHECK(j.is_object(), "{}: config must be a JSON object", path);
    if (j.contains("model_type"))
        ANVIL_CHECK(j["model_type"] == "gpt2", "{}: model_type is {}, anvil loads GPT-2 models only", path,
                    j["model_type"].dump());
    GPTConfig c;
    c.n_layer = get_int(j, "n_layer", path);
    c.n_head = get_int(j, "n_head", path);
    c.n_embd = get_int(j, "n_embd", path);
    c.n_ctx = get_int(j, j.contains("n_positions") ? "n_positions" : "n_ctx", path);
    c.vocab_size = get_int(j, "vocab_size", path);
    if (j.contains("activation_function") && j["activation_function"].is_string()) {
        const std::string act = j["activation_function"];
        ANVIL_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh",
                    "{}: activation_function \"{}\" is not "
                    "supported; anvil implements GPT-2's tanh GELU (gelu_new)",
                    path, act);
    }
    if (j.contains("tie_word_embeddings") && j["tie_word_embeddings"].is_boolean())
        ANVIL_CHECK(j["tie_word_embeddings"].get<bool>(), "{}: untied output embeddings are not supported",
                    path);
    if (j.contains("layer_norm_epsilon") && j["layer_norm_epsilon"].is_number())
        ANVIL_CHECK(std::abs(j["layer_norm_epsilon"].get<double>() - 1e-5) < 1e-9,
                    "{}: layer_norm_epsilon {} "
                    "is not supported; anvil uses GPT-2's 1e-5",
                    path, j["layer_norm_epsilon"].get<double>());
    if (j.contains("n_inner") && !j["n_inner"].is_null())
        ANVIL_CHECK(j["n_inner"] == 4 * c.n_embd, "{}: n_inner {} is not supported; anvil uses 4 * n_embd",
                    path, j["n_inner"].dump());
    c.validate(path);
    return c;
}

}  // namespace anvil
