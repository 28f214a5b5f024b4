#include "model/config.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/model.h"

namespace anvil {

int64_t ModelConfig::num_params() const {
    return model_family(model_type).num_params(*this);
}

double ModelConfig::flops_per_token(int T) const {
    const double N = double(num_params() - model_family(model_type).position_params(*this));
    return 6.0 * N + 12.0 * n_layer * double(n_embd) * T;
}

void ModelConfig::validate(const std::string& where) const {
    ANVIL_CHECK(n_layer > 0, "{}: the number of layers must be positive, got {}", where, n_layer);
    ANVIL_CHECK(n_head > 0, "{}: the number of heads must be positive, got {}", where, n_head);
    ANVIL_CHECK(n_embd > 0, "{}: the width must be positive, got {}", where, n_embd);
    ANVIL_CHECK(n_ctx > 0, "{}: the context length must be positive, got {}", where, n_ctx);
    ANVIL_CHECK(vocab_size > 0, "{}: the vocabulary size must be positive, got {}", where, vocab_size);
    ANVIL_CHECK(head_dim > 0 || n_embd % n_head == 0,
                "{}: width {} does not divide into {} heads; pick a width that is a multiple of the head count",
                where, n_embd, n_head);
    ANVIL_CHECK(n_kv_head >= 0 && n_head % kv_heads() == 0,
                "{}: {} heads do not share {} key/value heads evenly; the key/value heads must divide the heads",
                where, n_head, kv_heads());
    ANVIL_CHECK(ffn_dim >= 0 && head_dim >= 0, "{}: the MLP width and head size must be positive", where);
    ANVIL_CHECK(model_type == "gpt2" || head_size() % 2 == 0,
                "{}: head size {} is odd; rotary embeddings rotate pairs of channels", where, head_size());
    ANVIL_CHECK(rope_theta > 0 && norm_eps > 0 && norm_eps < 1, "{}: rope_theta {} and norm eps {} must be positive",
                where, rope_theta, norm_eps);
    ANVIL_CHECK(n_layer <= 1024 && n_embd <= 65536 && n_ctx <= 1 << 20 && vocab_size <= 1 << 24,
                "{}: model size out of range ({})", where, str());
}

std::string ModelConfig::str() const {
    const std::string window =
        hf_max_positions > 0
            ? fmt::format(" (Mistral's sliding window; max_position_embeddings {})", hf_max_positions)
            : "";
    std::string s = fmt::format("{} {} layers, {} heads, width {}, context {}{}, vocab {}", model_type,
                                n_layer, n_head, n_embd, n_ctx, window, vocab_size);
    if (model_type != "gpt2")
        s += fmt::format(", {} key/value heads, MLP {}{}", kv_heads(), ffn(), tie_embeddings ? ", tied head" : "");
    if (qkv_bias || o_bias || mlp_bias)
        s += fmt::format(", biases on {}", qkv_bias && o_bias && mlp_bias ? "every projection"
                                           : qkv_bias && o_bias           ? "q, k, v and o"
                                           : qkv_bias                     ? "q, k and v"
                                                                          : "the MLP");
    if (int8_weights) s += ", int8 weights";
    return s;
}

nlohmann::json config_to_hf_json(const ModelConfig& c, const nlohmann::json& extra) {
    nlohmann::json j = model_family(c.model_type).to_hf(c);
    if (c.int8_weights)
        j["quantization_config"] = {{"quant_method", kInt8Method},
                                    {"bits", 8},
                                    {"symmetric", true},
                                    {"granularity", "per-output-channel"},
                                    {"scale_suffix", "_scale"},
                                    {"activations", "float"}};
    for (auto it = extra.begin(); it != extra.end(); ++it) j[it.key()] = it.value();
    return j;
}

ModelConfig config_from_hf_json(const nlohmann::json& j, const std::string& path) {
    ANVIL_CHECK(j.is_object(), "{}: config must be a JSON object", path);
    std::string type = "gpt2";
    if (j.contains("model_type")) {
        ANVIL_CHECK(j["model_type"].is_string(), "{}: model_type must be a string, got {}", path,
                    j["model_type"].dump());
        type = j["model_type"].get<std::string>();
    }
    const ModelFamily* f = find_model_family(type);
    ANVIL_CHECK(f, "{}: model_type \"{}\" is not a family anvil implements ({})", path, type,
                known_model_types());
    ModelConfig c = f->from_hf(j, path);
    c.model_type = f->model_type;
    if (j.contains("quantization_config") && !j["quantization_config"].is_null()) {
        const nlohmann::json& q = j["quantization_config"];
        const std::string method = q.is_object() ? q.value("quant_method", std::string("?")) : q.dump();
        ANVIL_CHECK(method == kInt8Method,
                    "{}: quantization_config quant_method \"{}\" is not supported; anvil reads its own int8 "
                    "weights (\"{}\", written by anvil quantize); give the unquantized checkpoint",
                    path, method, kInt8Method);
        ANVIL_CHECK(q.value("bits", 0) == 8, "{}: quantization_config bits {} is not supported; anvil's int8 is 8",
                    path, q.value("bits", 0));
        c.int8_weights = true;
    }
    c.validate(path);
    return c;
}

}  // namespace anvil
