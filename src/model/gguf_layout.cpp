#include "model/gguf_layout.h"

#include <cmath>

#include "core/error.h"
#include "model/layers.h"
#include "model/model_io.h"

namespace anvil {

namespace {

using gguf::Value;

bool is_gpt2(const ModelConfig& c) {
    return c.model_type == "gpt2";
}

// GPT-2's Conv1D weights are stored (in, out); llama.cpp's, as every linear layer's, (out, in).
std::vector<float> transposed(const std::vector<float>& x, int64_t rows, int64_t cols) {
    std::vector<float> y(x.size());
    transpose(x.data(), y.data(), rows, cols);
    return y;
}

// Rows of a q or k projection (its weight or bias) in heads of `hd`: Hugging Face rotates the halves of each
// head (rows i and i + hd/2 are a pair), llama.cpp's rope adjacent rows (2i and 2i + 1). `to_gguf` moves rows
// from the first layout to the second, else back.
std::vector<float> permute_rope(const std::vector<float>& x, int64_t rows, int64_t cols, int hd,
                                bool to_gguf) {
    std::vector<float> y(x.size());
    const int half = hd / 2;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t h = r / hd, j = r % hd;
        const int64_t g = h * hd + (j < half ? 2 * j : 2 * (j - half) + 1);  // row r's place in GGUF
        const int64_t src = to_gguf ? r : g, dst = to_gguf ? g : r;
        std::copy_n(x.begin() + src * cols, cols, y.begin() + dst * cols);
    }
    return y;
}

// The part of a name after "<prefix>N.", with N in *layer; false when it is not a block's.
bool block_part(const std::string& n, const std::string& prefix, int* layer, std::string* rest) {
    if (!n.starts_with(prefix)) return false;
    const size_t dot = n.find('.', prefix.size());
    if (dot == std::string::npos || dot == prefix.size()) return false;
    for (size_t k = prefix.size(); k < dot; k++)
        if (n[k] < '0' || n[k] > '9') return false;
    *layer = std::stoi(n.substr(prefix.size(), dot - prefix.size()));
    *rest = n.substr(dot + 1);
    return true;
}

// (Hugging Face part, GGUF part, Conv1D (transposed)) of GPT-2's tensors, within a block and outside one.
struct NamePair {
    const char* hf;
    const char* gguf;
    bool conv1d = false;
};
constexpr NamePair kGpt2Block[] = {
    {"ln_1.weight", "attn_norm.weight"},
    {"ln_1.bias", "attn_norm.bias"},
    {"attn.c_attn.weight", "attn_qkv.weight", true},
    {"attn.c_attn.bias", "attn_qkv.bias"},
    {"attn.c_proj.weight", "attn_output.weight", true},
    {"attn.c_proj.bias", "attn_output.bias"},
    {"ln_2.weight", "ffn_norm.weight"},
    {"ln_2.bias", "ffn_norm.bias"},
    {"mlp.c_fc.weight", "ffn_up.weight", true},
    {"mlp.c_fc.bias", "ffn_up.bias"},
    {"mlp.c_proj.weight", "ffn_down.weight", true},
    {"mlp.c_proj.bias", "ffn_down.bias"},
};
constexpr NamePair kGpt2Top[] = {
    {"transformer.wte.weight", "token_embd.weight"},
    {"transformer.wpe.weight", "position_embd.weight"},
    {"transformer.ln_f.weight", "output_norm.weight"},
    {"transformer.ln_f.bias", "output_norm.bias"},
};
constexpr NamePair kLlamaBlock[] = {
    {"input_layernorm.weight", "attn_norm.weight"}, {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"},       {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.k_proj.bias", "attn_k.bias"},       {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.v_proj.bias", "attn_v.bias"},       {"self_attn.o_proj.weight", "attn_output.weight"},
    {"self_attn.o_proj.bias", "attn_output.bias"},  {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},    {"mlp.gate_proj.bias", "ffn_gate.bias"},
    {"mlp.up_proj.weight", "ffn_up.weight"},        {"mlp.up_proj.bias", "ffn_up.bias"},
    {"mlp.down_proj.weight", "ffn_down.weight"},    {"mlp.down_proj.bias", "ffn_down.bias"},
};
constexpr NamePair kLlamaTop[] = {
    {"model.embed_tokens.weight", "token_embd.weight"},
    {"model.norm.weight", "output_norm.weight"},
    {"lm_head.weight", "output.weight"},
};

// The pair naming `name` on side hf (true) or gguf (false), with its layer (-1 outside a block).
const NamePair* find_pair(const ModelConfig& c, const std::string& name, bool hf, int* layer) {
    const bool g = is_gpt2(c);
    const std::string prefix = hf ? (g ? "transformer.h." : "model.layers.") : "blk.";
    std::string rest;
    const auto look = [&](const auto& table, const std::string& n) -> const NamePair* {
        for (const NamePair& p : table)
            if (n == (hf ? p.hf : p.gguf)) return &p;
        return nullptr;
    };
    if (block_part(name, prefix, layer, &rest)) return g ? look(kGpt2Block, rest) : look(kLlamaBlock, rest);
    *layer = -1;
    return g ? look(kGpt2Top, name) : look(kLlamaTop, name);
}

// Whether the family rotates adjacent pairs in llama.cpp (its q and k rows permuted): Llama and Mistral do;
// Qwen 2 (NEOX rope, as Hugging Face's) does not.
bool interleaved_rope(const ModelConfig& c) {
    return c.model_type == "llama" || c.model_type == "mistral";
}

// The rows of q or k get permuted: the number of heads of this projection, or 0.
int rope_heads(const ModelConfig& c, const std::string& part) {
    if (!interleaved_rope(c)) return 0;
    if (part.starts_with("attn_q.")) return c.n_head;
    if (part.starts_with("attn_k.")) return c.kv_heads();
    return 0;
}

}  // namespace

std::string gguf_arch(const ModelConfig& c) {
    ANVIL_CHECK(!c.int8_weights,
                "the model holds anvil's int8 weights, which GGUF does not carry: export the model it was "
                "quantized from, with --dtype q8_0 for llama.cpp's own 8-bit form");
    if (is_gpt2(c)) return "gpt2";
    if (c.model_type == "llama" || c.model_type == "mistral") return "llama";
    if (c.model_type == "qwen2") return "qwen2";
    fail("model_type {}: no GGUF architecture for it in anvil (gpt2, llama, mistral, qwen2)", c.model_type);
}

void gguf_write_hparams(const ModelConfig& c, gguf::Writer& w) {
    const std::string a = gguf_arch(c);
    w.set(a + ".context_length", Value::u32(uint32_t(c.hf_max_positions > 0 ? c.hf_max_positions : c.n_ctx)));
    w.set(a + ".embedding_length", Value::u32(uint32_t(c.n_embd)));
    w.set(a + ".block_count", Value::u32(uint32_t(c.n_layer)));
    w.set(a + ".feed_forward_length", Value::u32(uint32_t(c.ffn())));
    w.set(a + ".attention.head_count", Value::u32(uint32_t(c.n_head)));
    if (is_gpt2(c)) {
        w.set(a + ".attention.layer_norm_epsilon", Value::f32(float(c.norm_eps)));
        return;
    }
    w.set(a + ".attention.head_count_kv", Value::u32(uint32_t(c.kv_heads())));
    w.set(a + ".attention.layer_norm_rms_epsilon", Value::f32(float(c.norm_eps)));
    w.set(a + ".rope.freq_base", Value::f32(float(c.rope_theta)));
    w.set(a + ".rope.dimension_count", Value::u32(uint32_t(c.head_size())));
    if (c.head_size() * c.n_head != c.n_embd) {
        w.set(a + ".attention.key_length", Value::u32(uint32_t(c.head_size())));
        w.set(a + ".attention.value_length", Value::u32(uint32_t(c.head_size())));
    }
    w.set(a + ".vocab_size", Value::u32(uint32_t(c.vocab_size)));
    const RopeScaling& s = c.rope_scaling;
    if (s.type == "linear") {
        w.set(a + ".rope.scaling.type", Value::str("linear"));
        w.set(a + ".rope.scaling.factor", Value::f32(float(s.factor)));
    } else if (s.type == "llama3") {
        // llama.cpp takes llama3 scaling from rope_freqs.weight (gguf_extra_tensors); anvil's import reads
        // the parameters back from its own keys
        w.set("anvil.rope_scaling.type", Value::str("llama3"));
        w.set("anvil.rope_scaling.factor", Value::f32(float(s.factor)));
        w.set("anvil.rope_scaling.low_freq_factor", Value::f32(float(s.low_freq_factor)));
        w.set("anvil.rope_scaling.high_freq_factor", Value::f32(float(s.high_freq_factor)));
        w.set("anvil.rope_scaling.original_max_position_embeddings",
              Value::u32(uint32_t(s.original_max_position_embeddings)));
    }
}

ModelConfig gguf_read_hparams(const gguf::Reader& r) {
    const std::string a = r.get_string("general.architecture");
    ModelConfig c;
    if (a == "gpt2")
        c.model_type = "gpt2";
    else if (a == "llama" || a == "qwen2")
        c.model_type = a;
    else
        fail("{}: general.architecture is {}: anvil reads gpt2, llama and qwen2 GGUF files", r.what(), a);
    const auto u = [&](const std::string& k) { return int(r.get_int(a + "." + k)); };
    c.n_ctx = u("context_length");
    c.n_embd = u("embedding_length");
    c.n_layer = u("block_count");
    c.ffn_dim = u("feed_forward_length");
    c.n_head = u("attention.head_count");
    const gguf::TensorInfo* emb = r.tensor("token_embd.weight");
    ANVIL_CHECK(emb && emb->ne.size() == 2, "{}: no 2-D token_embd.weight", r.what());
    c.vocab_size = int(emb->ne[1]);
    if (c.model_type == "gpt2") {
        c.norm_eps = r.get_float(a + ".attention.layer_norm_epsilon");
        c.tie_embeddings = r.tensor("output.weight") == nullptr;
        ANVIL_CHECK(c.tie_embeddings, "{}: a GPT-2 with its own output.weight: anvil's GPT-2 ties its head",
                    r.what());
        return c;
    }
    c.n_kv_head = r.find(a + ".attention.head_count_kv") ? u("attention.head_count_kv") : c.n_head;
    c.norm_eps = r.get_float(a + ".attention.layer_norm_rms_epsilon");
    if (r.find(a + ".rope.freq_base")) c.rope_theta = r.get_float(a + ".rope.freq_base");
    if (r.find(a + ".attention.key_length")) c.head_dim = u("attention.key_length");
    c.tie_embeddings = r.tensor("output.weight") == nullptr;
    c.qkv_bias = r.tensor("blk.0.attn_q.bias") != nullptr;
    c.o_bias = r.tensor("blk.0.attn_output.bias") != nullptr;
    c.mlp_bias = r.tensor("blk.0.ffn_up.bias") != nullptr;
    if (r.find(a + ".rope.scaling.type")) {
        const std::string t = r.get_string(a + ".rope.scaling.type");
        ANVIL_CHECK(t == "linear" || t == "none", "{}: rope scaling {}: anvil runs linear and llama3",
                    r.what(), t);
        if (t == "linear") c.rope_scaling = {"linear", r.get_float(a + ".rope.scaling.factor")};
    }
    if (r.find("anvil.rope_scaling.type")) {
        c.rope_scaling.type = r.get_string("anvil.rope_scaling.type");
        c.rope_scaling.factor = r.get_float("anvil.rope_scaling.factor");
        c.rope_scaling.low_freq_factor = r.get_float("anvil.rope_scaling.low_freq_factor");
        c.rope_scaling.high_freq_factor = r.get_float("anvil.rope_scaling.high_freq_factor");
        c.rope_scaling.original_max_position_embeddings =
            int(r.get_int("anvil.rope_scaling.original_max_position_embeddings"));
    } else {
        ANVIL_CHECK(!r.tensor("rope_freqs.weight"),
                    "{}: rope_freqs.weight (Llama 3.1's rope scaling) without its parameters: anvil imports "
                    "rope-scaled models from Hugging Face directories (anvil convert --model DIR)",
                    r.what());
    }
    return c;
}

bool gguf_from_hf(const ModelConfig& c, const std::string& hf_name, const std::vector<int64_t>& shape,
                  std::vector<float> data, GgufTensor* out) {
    int layer = -1;
    const NamePair* p = find_pair(c, hf_name, true, &layer);
    if (!p) return false;
    out->name = layer >= 0 ? "blk." + std::to_string(layer) + "." + p->gguf : p->gguf;
    if (shape.size() == 1) {
        out->ne = {uint64_t(shape[0])};
    } else {
        ANVIL_ASSERT(shape.size() == 2);
        int64_t rows = shape[0], cols = shape[1];
        if (p->conv1d) {
            if (!data.empty()) data = transposed(data, rows, cols);
            std::swap(rows, cols);
        }
        out->ne = {uint64_t(cols), uint64_t(rows)};
    }
    if (data.empty()) return true;  // the name and dimensions only
    if (const int heads = rope_heads(c, p->gguf)) {
        const int64_t rows = shape[0], cols = shape.size() == 2 ? shape[1] : 1;
        ANVIL_ASSERT(rows == int64_t(heads) * c.head_size());
        data = permute_rope(data, rows, cols, c.head_size(), true);
    }
    out->data = std::move(data);
    return true;
}

bool gguf_lora_from_hf(const ModelConfig& c, const std::string& hf_name, const std::vector<int64_t>& shape,
                       std::vector<float> data, GgufTensor* out) {
    const bool a = hf_name.ends_with(".lora_A.weight"), b = hf_name.ends_with(".lora_B.weight");
    if ((!a && !b) || shape.size() != 2) return false;
    const std::string layer = hf_name.substr(0, hf_name.size() - std::string(".lora_A.weight").size());
    int n = -1;
    const NamePair* p = find_pair(c, layer + ".weight", true, &n);
    if (!p) return false;
    out->name = (n >= 0 ? "blk." + std::to_string(n) + "." + p->gguf : std::string(p->gguf)) +
                (a ? ".lora_a" : ".lora_b");
    out->ne = {uint64_t(shape[1]), uint64_t(shape[0])};  // both as stored: A (rank, in), B (out, rank)
    if (b && !data.empty())
        if (const int heads = rope_heads(c, p->gguf))
            data = permute_rope(data, shape[0], shape[1], c.head_size(), true);
    out->data = std::move(data);
    return true;
}

std::vector<GgufTensor> gguf_extra_tensors(const ModelConfig& c) {
    if (c.rope_scaling.type != "llama3") return {};
    // rope_freqs: how much each frequency is divided by, the unscaled frequency over the scaled one
    const std::vector<float> base = rope_inv_freq(c.head_size(), c.rope_theta, {});
    const std::vector<float> scaled = rope_inv_freq(c.head_size(), c.rope_theta, c.rope_scaling);
    GgufTensor t{"rope_freqs.weight", {uint64_t(base.size())}, {}};
    for (size_t i = 0; i < base.size(); i++) t.data.push_back(base[i] / scaled[i]);
    return {t};
}

bool hf_from_gguf(const ModelConfig& c, const GgufTensor& t, std::string* hf_name,
                  std::vector<int64_t>* shape, std::vector<float>* data) {
    int layer = -1;
    const NamePair* p = find_pair(c, t.name, false, &layer);
    if (!p) return false;
    const std::string prefix = is_gpt2(c) ? "transformer.h." : "model.layers.";
    *hf_name = layer >= 0 ? prefix + std::to_string(layer) + "." + p->hf : p->hf;
    *data = t.data;
    if (t.ne.size() == 1) {
        *shape = {int64_t(t.ne[0])};
    } else {
        ANVIL_CHECK(t.ne.size() == 2, "GGUF tensor {}: {} dimensions where 2 are expected", t.name,
                    t.ne.size());
        const int64_t rows = int64_t(t.ne[1]), cols = int64_t(t.ne[0]);
        *shape = {rows, cols};
        if (p->conv1d) {
            *data = transposed(*data, rows, cols);
            *shape = {cols, rows};
        }
    }
    if (const int heads = rope_heads(c, p->gguf)) {
        const int64_t rows = int64_t(t.ne.size() == 2 ? t.ne[1] : t.ne[0]);
        const int64_t cols = t.ne.size() == 2 ? int64_t(t.ne[0]) : 1;
        ANVIL_CHECK(rows == int64_t(heads) * c.head_size(),
                    "GGUF tensor {}: {} rows where {} heads of {} are expected", t.name, rows, heads,
                    c.head_size());
        *data = permute_rope(*data, rows, cols, c.head_size(), false);
    }
    return true;
}

}  // namespace anvil
