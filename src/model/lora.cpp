#include "model/lora.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "io/fs.h"
#include "io/json_text.h"
#include "io/safetensors.h"
#include "model/model.h"

namespace anvil {

namespace {

constexpr const char* kPeftPrefix = "base_model.model.";

bool matches(const std::string& name, const std::string& target) {
    return name == target || (name.size() > target.size() && name.ends_with("." + target));
}

std::string layer_list(const std::vector<Linear*>& linears) {
    std::string s;
    for (size_t i = 0; i < linears.size() && i < 8; i++) s += (i ? ", " : "") + linears[i]->name();
    return s + (linears.size() > 8 ? ", ..." : "");
}


}  // namespace

float LoraOptions::scaling() const {
    return rslora ? alpha / std::sqrt(float(rank)) : alpha / float(rank);
}

LoraAdapter::LoraAdapter(ParamRegistry& reg, const std::string& layer, size_t a, size_t b, int in, int out,
                         const LoraOptions& o, int id)
    : reg_(&reg),
      a_(a),
      b_(b),
      in_(in),
      out_(out),
      rank_(o.rank),
      id_(id),
      scaling_(o.scaling()),
      dropout_(o.dropout),
      h_(reg.acts.id(layer + ".lora_h")),
      y_(reg.acts.id(fmt::format("lora.y{}", out))),
      x_(reg.acts.id(fmt::format("lora.x{}", in))),
      dh_(reg.acts.id(fmt::format("lora.dh{}", o.rank))),
      dx_(reg.acts.id(fmt::format("lora.dx{}", in))) {}

void LoraAdapter::plan(ActPlan& plan) const {
    const DType a = reg_->dtype;
    plan.add(h_, {rank_}, a, Keep::Saved, fmt::format("lora.h{}", rank_));  // s * x A^T
    plan.add(y_, {out_}, a, Keep::Scratch);
    if (dropout_ > 0.0f && plan.training()) plan.add(x_, {in_}, a, Keep::Scratch);
    plan.add(dh_, {rank_}, a, Keep::Backward);
    plan.add(dx_, {in_}, a, Keep::Backward);
}

Tensor LoraAdapter::dropped(const Pass& p, Tensor in) const {
    if (dropout_ <= 0.0f || !p.train) return in;
    const Tensor x = p.act(x_);
    p.be.dropout(x, in, dropout_,
                 p.seed * 0x9e3779b97f4a7c15ull + uint64_t(id_));  // one mask per layer and pass
    return x;
}

void LoraAdapter::forward(const Pass& p, Tensor out, Tensor in) const {
    const ParamStore& s = *reg_->store;
    const Tensor h = p.act(h_), y = p.act(y_);
    p.be.matmul_fwd(h, dropped(p, in), s.param(a_), WLayout::OutIn, {}, {});  // (N, r) = x A^T
    p.be.scale(h, scaling_);
    p.be.matmul_fwd(y, h, s.param(b_), WLayout::OutIn, {}, {});  // (N, out) = h B^T
    p.be.residual_fwd(out, out, y);
}

void LoraAdapter::backward(const Pass& p, Tensor din, Tensor dout, Tensor in) const {
    const ParamStore& s = *reg_->store;
    const Tensor h = p.act(h_), dh = p.act(dh_);
    p.be.matmul_bwd(dh, s.grad(b_), {}, dout, h, s.param(b_), WLayout::OutIn, {});  // dB += dy^T h, dh = dy B
    p.be.scale(dh, scaling_);
    const Tensor dx = din.empty() ? Tensor{} : p.act(dx_);
    p.be.matmul_bwd(dx, s.grad(a_), {}, dh, dropped(p, in), s.param(a_), WLayout::OutIn, {});  // dA += dh^T x
    if (din.empty()) return;
    if (dropout_ > 0.0f && p.train)
        p.be.dropout(dx, dx, dropout_, p.seed * 0x9e3779b97f4a7c15ull + uint64_t(id_));
    p.be.residual_fwd(din, din, dx);
}

std::function<void()> add_lora(ParamRegistry& reg, const std::vector<Linear*>& linears,
                               const LoraOptions& o) {
    ANVIL_CHECK(o.rank > 0, "--lora-rank {}: must be positive", o.rank);
    ANVIL_CHECK(o.dropout >= 0.0f && o.dropout < 1.0f, "--lora-dropout {}: must be in [0, 1)", o.dropout);
    std::vector<Linear*> chosen;
    for (const std::string& t : o.targets) {
        size_t n = 0;
        for (Linear* l : linears)
            if (matches(l->name(), t)) {
                n++;
                if (std::find(chosen.begin(), chosen.end(), l) == chosen.end()) chosen.push_back(l);
            }
        ANVIL_CHECK(n > 0,
                    "--lora-targets: \"{}\" names no linear layer; the layers are {} (a target matches the "
                    "end of a name, as in PEFT)",
                    t, layer_list(linears));
    }
    for (ParamSpec& s : reg.specs) s.trainable = false;  // the base is frozen
    struct Pending {
        Linear* lin;
        size_t a, b;
    };
    auto pending = std::make_shared<std::vector<Pending>>();
    for (Linear* l : chosen) {
        ANVIL_CHECK(o.rank <= std::min(l->in_features(), l->out_features()),
                    "--lora-rank {}: larger than {} ({} inputs, {} outputs); use a rank of at most {}",
                    o.rank, l->name(), l->in_features(), l->out_features(),
                    std::min(l->in_features(), l->out_features()));
        const double bound =
            1.0 / std::sqrt(double(l->in_features()));  // kaiming_uniform_(a=sqrt(5)), as PEFT
        const size_t a = reg.add({l->name() + ".lora_A.weight",
                                  {o.rank, l->in_features()},
                                  DType::F32,
                                  true,
                                  {Init::Uniform, bound},
                                  true,
                                  l->layer(),
                                  true});
        const size_t b = reg.add({l->name() + ".lora_B.weight",
                                  {l->out_features(), o.rank},
                                  DType::F32,
                                  true,
                                  {Init::Zeros, 0.0},
                                  true,
                                  l->layer(),
                                  true});
        pending->push_back({l, a, b});
    }
    return [&reg, pending, o] {
        int id = 0;
        for (const Pending& p : *pending)
            p.lin->set_adapter(std::make_shared<LoraAdapter>(
                reg, p.lin->name(), p.a, p.b, p.lin->in_features(), p.lin->out_features(), o, id++));
    };
}

void write_peft_adapter(const std::string& dir, const Model& model, const std::string& base_path,
                        const std::function<void(size_t, float*)>& weight_f32) {
    const LoraOptions& o = model.options().lora;
    ANVIL_ASSERT(o.enabled());
    const nlohmann::json cfg = {
        {"peft_type", "LORA"},
        {"task_type", "CAUSAL_LM"},
        {"r", o.rank},
        {"lora_alpha", o.alpha},
        {"lora_dropout", o.dropout},
        {"target_modules", o.targets},
        {"fan_in_fan_out", model.linear_layout() == WLayout::InOut},
        {"bias", "none"},
        {"use_rslora", o.rslora},
        {"modules_to_save", nullptr},
        {"init_lora_weights", true},
        {"inference_mode", true},
        {"base_model_name_or_path", base_path},
    };
    write_file_atomic(dir + "/adapter_config.json", json_text(cfg, 2) + "\n");
    const ParamStore& store = model.params();
    std::vector<StMeta> metas;
    std::vector<size_t> idx;
    for (size_t i = 0; i < store.size(); i++)
        if (store.spec(i).adapter) {
            metas.push_back({kPeftPrefix + store.spec(i).name, DType::F32, store.spec(i).shape.vec()});
            idx.push_back(i);
        }
    write_safetensors_streamed(dir + "/adapter_model.safetensors", metas,
                               [&](size_t k, void* dst) { weight_f32(idx[k], static_cast<float*>(dst)); },
                               {{"format", "pt"}});
}

PeftAdapter read_peft_config(const std::string& dir, const Model* family_of) {
    const std::string path = dir + "/adapter_config.json";
    ANVIL_CHECK(dir_exists(dir), "--adapter {}: no such directory", dir);
    ANVIL_CHECK(file_exists(path), "{}: missing; an adapter directory holds PEFT's adapter_config.json",
                path);
    const nlohmann::json j = read_json_file(path);
    auto need = [&](const char* key) -> const nlohmann::json& {
        ANVIL_CHECK(j.contains(key) && !j[key].is_null(), "{}: no \"{}\"; PEFT's LoRA config has it", path,
                    key);
        return j[key];
    };
    const std::string type = need("peft_type").is_string() ? need("peft_type").get<std::string>() : "";
    ANVIL_CHECK(type == "LORA", "{}: peft_type {} is not supported; anvil reads LoRA adapters (\"LORA\")",
                path, need("peft_type").dump());
    PeftAdapter a;
    ANVIL_CHECK(need("r").is_number_integer() && need("r").get<int>() > 0,
                "{}: \"r\" must be a positive integer", path);
    a.lora.rank = need("r").get<int>();
    ANVIL_CHECK(need("lora_alpha").is_number(), "{}: \"lora_alpha\" must be a number", path);
    a.lora.alpha = need("lora_alpha").get<float>();
    a.lora.dropout = j.value("lora_dropout", 0.0f);
    a.lora.rslora = j.value("use_rslora", false);
    const nlohmann::json& t = need("target_modules");
    if (t.is_string()) {
        a.lora.targets = {t.get<std::string>()};
    } else {
        ANVIL_CHECK(t.is_array() && !t.empty(), "{}: \"target_modules\" must be a name or a list of names",
                    path);
        for (const auto& x : t) a.lora.targets.push_back(x.get<std::string>());
    }
    const std::string bias = j.value("bias", std::string("none"));
    ANVIL_CHECK(bias == "none", "{}: bias \"{}\" is not supported; anvil trains LoRA with bias \"none\"",
                path, bias);
    if (family_of && j.contains("fan_in_fan_out") && j["fan_in_fan_out"].is_boolean())
        ANVIL_CHECK(j["fan_in_fan_out"].get<bool>() == (family_of->linear_layout() == WLayout::InOut),
                    "{}: fan_in_fan_out {} does not match the base model's linear layers ({})", path,
                    j["fan_in_fan_out"].dump(), family_of->config().model_type);
    a.base_model = j.value("base_model_name_or_path", std::string());
    return a;
}

void load_peft_weights(const std::string& dir, Model& model,
                       const std::function<void(size_t, const float*)>& on_f32) {
    const std::string path = dir + "/adapter_model.safetensors";
    ANVIL_CHECK(file_exists(path), "{}: missing; an adapter directory holds PEFT's adapter_model.safetensors",
                path);
    SafetensorsReader st(path);
    ParamStore& store = model.params();
    std::set<std::string> used;
    std::vector<float> f32;
    for (size_t i = 0; i < store.size(); i++) {
        const ParamSpec& s = store.spec(i);
        if (!s.adapter) continue;
        std::string name = kPeftPrefix + s.name;
        const StEntry* e = st.find(name);
        if (!e) {  // PEFT also writes the adapter's name in: lora_A.default.weight
            name = name.substr(0, name.size() - 7) + ".default.weight";
            e = st.find(name);
        }
        ANVIL_CHECK(e,
                    "{}: tensor \"{}{}\" is missing; the adapter does not target this layer with this rank",
                    path, kPeftPrefix, s.name);
        ANVIL_CHECK(
            e->shape == s.shape.vec(),
            "{}: tensor \"{}\" has shape ({}, {}) but the base model's layer needs {}; the adapter was "
            "trained on another base model",
            path, e->name, e->shape.size() > 0 ? e->shape[0] : 0, e->shape.size() > 1 ? e->shape[1] : 0,
            s.shape.str());
        ANVIL_CHECK(e->known && (e->dtype == DType::F32 || e->dtype == DType::BF16 || e->dtype == DType::F16),
                    "{}: tensor \"{}\" has dtype {}; anvil reads F32, BF16 and F16", path, e->name,
                    e->dtype_name);
        f32.resize(size_t(e->numel()));
        convert_to_f32(f32.data(), st.raw(*e), e->dtype, f32.size());
        if (on_f32) on_f32(i, f32.data());
        store.write_f32(i, f32.data());
        used.insert(e->name);
    }
    for (const StEntry& e : st.entries())
        ANVIL_CHECK(used.count(e.name), "{}: tensor \"{}\" belongs to no adapter of this model (targets {})",
                    path, e.name, nlohmann::json(model.options().lora.targets).dump());
}

void merge_lora(Model& model) {
    ANVIL_CHECK(
        !model.config().int8_weights,
        "merging into int8 weights would round the adapter away; merge into the float base model, then run "
        "anvil quantize on the merged one");
    ParamStore& store = model.params();
    const LoraOptions& o = model.options().lora;
    const float s = o.scaling();
    for (Linear* l : model.linears()) {
        const size_t a = store.find(l->name() + ".lora_A.weight"),
                     b = store.find(l->name() + ".lora_B.weight");
        if (a == ParamStore::npos) continue;
        const std::vector<float> A = store.read_f32(a), B = store.read_f32(b);  // (r, in), (out, r)
        std::vector<float> W = store.read_f32(l->weight_index());
        const int in = l->in_features(), out = l->out_features(), r = o.rank;
        const bool in_out = model.linear_layout() == WLayout::InOut;
        for (int i = 0; i < in; i++)
            for (int j = 0; j < out; j++) {
                double d = 0.0;  // (B A)[j][i]
                for (int k = 0; k < r; k++) d += double(B[size_t(j) * r + k]) * A[size_t(k) * in + i];
                W[in_out ? size_t(i) * out + j : size_t(j) * in + i] += float(s * d);
            }
        store.write_f32(l->weight_index(), W.data());
    }
}

}  // namespace anvil
