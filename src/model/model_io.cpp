#include "model/model_io.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include "io/fs.h"
#include "io/json_text.h"
#include "io/safetensors.h"

namespace anvil {

ModelConfig read_model_config(const std::string& dir, nlohmann::json* raw) {
    const std::string path = dir + "/config.json";
    ANVIL_CHECK(dir_exists(dir),
                "{}: no such directory; give a model directory holding config.json and model.safetensors", dir);
    ANVIL_CHECK(file_exists(path), "{}: missing; a model directory needs a Hugging Face config.json", path);
    const nlohmann::json j = read_json_file(path);
    ModelConfig c = config_from_hf_json(j, path);
    if (raw) *raw = j;
    return c;
}

namespace {

std::vector<int64_t> dims(const Shape& s) {
    return {s.dims.begin(), s.dims.begin() + s.ndim};
}

std::string shape_str(const std::vector<int64_t>& s) {
    std::string r = "(";
    for (size_t i = 0; i < s.size(); i++) r += (i ? ", " : "") + std::to_string(s[i]);
    return r + ")";
}

// The safetensors files of a model directory: one file, or the shards an index names.
struct WeightFiles {
    std::vector<std::unique_ptr<SafetensorsReader>> readers;
    std::map<std::string, std::pair<const SafetensorsReader*, const StEntry*>> tensors;  // file name -> where

    explicit WeightFiles(const std::string& dir) {
        const std::string index = dir + "/model.safetensors.index.json", single = dir + "/model.safetensors";
        std::vector<std::string> files;
        if (file_exists(index)) {
            const nlohmann::json j = read_json_file(index);
            ANVIL_CHECK(j.contains("weight_map") && j["weight_map"].is_object(),
                        "{}: no \"weight_map\" object; a sharded checkpoint's index names each tensor's file", index);
            std::set<std::string> names;
            for (const auto& [name, file] : j["weight_map"].items()) {
                ANVIL_CHECK(file.is_string(), "{}: the file of \"{}\" must be a string", index, name);
                names.insert(file.get<std::string>());
            }
            for (const auto& f : names) {
                ANVIL_CHECK(f.find('/') == std::string::npos && file_exists(dir + "/" + f),
                            "{}: names shard \"{}\", which is not in {}", index, f, dir);
                files.push_back(dir + "/" + f);
            }
        } else {
            ANVIL_CHECK(std::filesystem::exists(single),
                        "{}: missing (and no model.safetensors.index.json); anvil reads weights from safetensors",
                        single);
            files.push_back(single);
        }
        for (const auto& f : files) {
            readers.push_back(std::make_unique<SafetensorsReader>(f));
            for (const StEntry& e : readers.back()->entries()) {
                const auto [it, fresh] = tensors.emplace(e.name, std::make_pair(readers.back().get(), &e));
                ANVIL_CHECK(fresh, "{}: tensor \"{}\" is also in {}", f, e.name, it->second.first->path());
            }
        }
    }
};

}  // namespace

void load_model_weights(const std::string& dir, Model& model,
                        const std::function<void(size_t, const float*)>& on_f32) {
    WeightFiles files(dir);
    ParamStore& store = model.params();
    std::vector<const StEntry*> found(store.size(), nullptr);
    std::vector<const SafetensorsReader*> from(store.size(), nullptr);
    for (const auto& [name, where] : files.tensors) {
        const size_t i = store.find(model.canonical_name(name));
        if (i == ParamStore::npos) {
            ANVIL_CHECK(model.ignorable_tensor(name), "{}: unexpected tensor \"{}\"; is this a {} checkpoint of {}?",
                        where.first->path(), name, model.config().model_type, model.config().str());
            continue;
        }
        ANVIL_CHECK(!found[i], "{}: \"{}\" is stored twice (also as \"{}\")", where.first->path(),
                    store.spec(i).name, found[i]->name);
        found[i] = where.second;
        from[i] = where.first;
    }
    std::vector<float> f32;
    for (size_t i = 0; i < store.size(); i++) {
        const ParamSpec& s = store.spec(i);
        if (s.adapter) continue;  // adapters come from their own files (lora.h)
        ANVIL_CHECK(found[i], "{}: tensor \"{}\" is missing; the weights do not match a model of {}", dir, s.name,
                    model.config().str());
        const StEntry& e = *found[i];
        ANVIL_CHECK(e.shape == dims(s.shape), "{}: tensor \"{}\" has shape {} but config.json implies {}",
                    from[i]->path(), e.name, shape_str(e.shape), shape_str(dims(s.shape)));
        ANVIL_CHECK(e.known && (e.dtype == DType::F32 || e.dtype == DType::BF16 || e.dtype == DType::F16),
                    "{}: tensor \"{}\" has dtype {}; anvil reads F32, BF16 and F16 weights", from[i]->path(), e.name,
                    e.dtype_name);
        if (e.dtype == s.dtype && !on_f32) {  // straight from the mapped file
            store.backend().upload(store.param(i), from[i]->raw(e));
            continue;
        }
        f32.resize(size_t(e.numel()));
        convert_to_f32(f32.data(), from[i]->raw(e), e.dtype, f32.size());
        if (on_f32) on_f32(i, f32.data());
        store.write_f32(i, f32.data());
    }
}

void write_model_dir(const std::string& dir, const Model& model, const nlohmann::json& extra,
                     const std::function<void(size_t, float*)>& weight_f32) {
    const nlohmann::json cfg = config_to_hf_json(model.config(), extra);
    write_file_atomic(dir + "/config.json", cfg.dump(2) + "\n");
    const ParamStore& store = model.params();
    std::vector<StMeta> metas;
    std::vector<size_t> idx;  // the base model's entries (adapters are saved apart)
    for (size_t i = 0; i < store.size(); i++)
        if (!store.spec(i).adapter) {
            metas.push_back({store.spec(i).name, DType::F32, dims(store.spec(i).shape)});
            idx.push_back(i);
        }
    write_safetensors_streamed(
        dir + "/model.safetensors", metas,
        [&](size_t k, void* dst) {
            if (weight_f32) return weight_f32(idx[k], static_cast<float*>(dst));
            const std::vector<float> v = store.read_f32(idx[k]);
            std::copy(v.begin(), v.end(), static_cast<float*>(dst));
        },
        {{"format", "pt"}});
}

}  // namespace anvil
