#include "io/checkpoint.h"

#include <filesystem>
#include <set>

#include "io/fs.h"
#include "io/json_text.h"
#include "io/safetensors.h"

namespace anvil {

GPTConfig read_model_config(const std::string& dir, nlohmann::json* raw) {
    const std::string path = dir + "/config.json";
    ANVIL_CHECK(dir_exists(dir),
                "{}: no such directory; give a checkpoint directory holding config.json and "
                "model.safetensors",
                dir);
    ANVIL_CHECK(file_exists(path), "{}: missing; a model directory needs an HF GPT-2 config.json", path);
    const nlohmann::json j = read_json_file(path);
    GPTConfig c = config_from_hf_json(j, path);
    if (raw) *raw = j;
    return c;
}

namespace {
std::vector<uint8_t> download_bytes(Backend& be, Tensor t) {
    std::vector<uint8_t> raw(t.nbytes());
    be.download(raw.data(), t);
    return raw;
}
std::vector<int64_t> dims(const Shape& s) {
    return {s.dims.begin(), s.dims.begin() + s.ndim};
}
std::string shape_str(const std::vector<int64_t>& s) {
    std::string r = "(";
    for (size_t i = 0; i < s.size(); i++) r += (i ? ", " : "") + std::to_string(s[i]);
    return r + ")";
}
}  // namespace

std::vector<std::vector<float>> read_model_weights(const std::string& dir, const GPT2& model) {
    const std::string path = dir + "/model.safetensors";
    ANVIL_CHECK(std::filesystem::exists(path), "{}: missing; anvil reads weights from model.safetensors",
                path);
    SafetensorsReader st(path);
    const auto& info = model.params_info();
    std::vector<std::vector<float>> host;
    std::set<std::string> used;
    for (const auto& p : info) {
        const StEntry* e = st.find(p.name);
        if (!e) e = st.find(p.name.substr(std::string("transformer.").size()));
        ANVIL_CHECK(e, "{}: tensor \"{}\" is missing; the file does not match a GPT-2 model of {}", path,
                    p.name, model.config().str());
        const std::vector<int64_t> want = dims(p.shape);
        ANVIL_CHECK(e->shape == want, "{}: tensor \"{}\" has shape {} but config.json implies {}", path,
                    e->name, shape_str(e->shape), shape_str(want));
        host.push_back(st.read_f32(*e));
        used.insert(e->name);
    }
    for (const auto& e : st.entries()) {
        if (used.count(e.name)) continue;
        const bool buffer = e.name.ends_with(".attn.bias") || e.name.ends_with(".attn.masked_bias");
        const bool tied = e.name == "lm_head.weight";
        ANVIL_CHECK(buffer || tied, "{}: unexpected tensor \"{}\"; is this a GPT-2 checkpoint?", path,
                    e.name);
    }
    return host;
}

void load_model_weights(const std::string& dir, GPT2& model) {
    model.params_from_host(read_model_weights(dir, model));
}

void write_model_files(const std::string& dir, const GPT2& model, const nlohmann::json& extra,
                       const std::vector<std::vector<float>>& weights) {
    nlohmann::json cfg = config_to_hf_json(model.config(), extra);
    write_file_atomic(dir + "/config.json", cfg.dump(2) + "\n");
    const auto host = weights.empty() ? model.params_to_host() : weights;
    std::vector<StTensor> ts;
    for (size_t i = 0; i < host.size(); i++)
        ts.push_back(
            {model.params_info()[i].name, DType::F32, dims(model.params_info()[i].shape), host[i].data()});
    write_safetensors(dir + "/model.safetensors", ts, {{"format", "pt"}});
}

void write_optimizer_state(const std::string& dir, const GPT2& model, const AdamW& opt) {
    Backend& be = model.backend();
    std::vector<std::vector<uint8_t>> keep;
    std::vector<StTensor> ts;
    const auto& info = model.params_info();
    for (size_t i = 0; i < info.size(); i++) {
        keep.push_back(download_bytes(be, opt.m()[i]));
        ts.push_back({"exp_avg." + info[i].name, DType::F32, dims(info[i].shape), keep.back().data()});
        keep.push_back(download_bytes(be, opt.v()[i]));
        ts.push_back({"exp_avg_sq." + info[i].name, DType::F32, dims(info[i].shape), keep.back().data()});
    }
    write_safetensors(dir + "/optimizer.safetensors", ts);
}

void load_optimizer_state(const std::string& dir, const GPT2& model, AdamW& opt) {
    const std::string path = dir + "/optimizer.safetensors";
    ANVIL_CHECK(file_exists(path),
                "{}: missing; --resume needs a training checkpoint (it holds the optimizer "
                "state), or use --init to start a new run from the weights",
                path);
    SafetensorsReader st(path);
    Backend& be = model.backend();
    const auto& info = model.params_info();
    for (size_t i = 0; i < info.size(); i++) {
        for (int k = 0; k < 2; k++) {
            const std::string name = (k == 0 ? "exp_avg." : "exp_avg_sq.") + info[i].name;
            const StEntry* e = st.find(name);
            ANVIL_CHECK(e, "{}: tensor \"{}\" is missing", path, name);
            ANVIL_CHECK(e->shape == dims(info[i].shape) && e->known && e->dtype == DType::F32,
                        "{}: tensor \"{}\" must be F32 of shape {}", path, name,
                        shape_str(dims(info[i].shape)));
            be.upload(k == 0 ? opt.m()[i] : opt.v()[i], st.raw(*e));
        }
    }
}

}  // namespace anvil
