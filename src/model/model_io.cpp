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
                "{}: no such directory; give a model directory holding config.json and model.safetensors",
                dir);
    ANVIL_CHECK(file_exists(path), "{}: missing; a model directory needs a Hugging Face config.json", path);
    const nlohmann::json j = read_json_file(path);
    ModelConfig c = config_from_hf_json(j, path);
    if (raw) *raw = j;
    return c;
}

namespace {

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
                        "{}: no \"weight_map\" object; a sharded checkpoint's index names each tensor's file",
                        index);
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
            ANVIL_CHECK(
                std::filesystem::exists(single),
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
    // int8 tensors (anvil quantize) in a directory whose config.json does not say so
    const auto check_int8_config = [&](bool int8_tensor, const SafetensorsReader* file,
                                       const std::string& name) {
        ANVIL_CHECK(
            model.config().int8_weights || !int8_tensor,
            "{}: tensor \"{}\" belongs to int8 weights but {}/config.json has no quantization_config; an "
            "int8 directory is written by anvil quantize together with its config.json",
            file->path(), name, dir);
    };
    for (const auto& [name, where] : files.tensors) {
        const size_t i = store.find(model.canonical_name(name));
        if (i == ParamStore::npos) {
            check_int8_config(where.second->dtype == DType::I8 || name.ends_with("_scale"), where.first,
                              name);
            ANVIL_CHECK(model.ignorable_tensor(name),
                        "{}: unexpected tensor \"{}\"; is this a {} checkpoint of {}?", where.first->path(),
                        name, model.config().model_type, model.config().str());
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
        ANVIL_CHECK(found[i], "{}: tensor \"{}\" is missing; the weights do not match a model of {}", dir,
                    s.name, model.config().str());
        const StEntry& e = *found[i];
        ANVIL_CHECK(e.shape == s.full_shape().vec(),
                    "{}: tensor \"{}\" has shape {} but config.json implies {}", from[i]->path(), e.name,
                    shape_str(e.shape), shape_str(s.full_shape().vec()));
        if (s.dtype == DType::I8 || (e.known && e.dtype == DType::I8)) {  // int8 weights (anvil quantize)
            check_int8_config(true, from[i], e.name);
            ANVIL_CHECK(e.known && e.dtype == DType::I8,
                        "{}: tensor \"{}\" has dtype {}, but {}/config.json says the weights are int8 "
                        "(quantization_config); the file does not belong to this config",
                        from[i]->path(), e.name, e.dtype_name, dir);
            store.backend().upload(store.param(i), from[i]->raw(e));
            continue;
        }
        ANVIL_CHECK(e.known && (e.dtype == DType::F32 || e.dtype == DType::BF16 || e.dtype == DType::F16),
                    "{}: tensor \"{}\" has dtype {}; anvil reads F32, BF16 and F16 weights", from[i]->path(),
                    e.name, e.dtype_name);
        if (e.dtype == s.dtype && !on_f32 && !s.shard.split()) {  // straight from the mapped file
            store.backend().upload(store.param(i), from[i]->raw(e));
            continue;
        }
        f32.resize(size_t(e.numel()));
        convert_to_f32(f32.data(), from[i]->raw(e), e.dtype, f32.size());
        keep_shard(s, f32);  // tensor parallel: this rank's piece of the whole tensor
        if (on_f32) on_f32(i, f32.data());
        store.write_f32(i, f32.data());
    }
}

void write_model_dir(const std::string& dir, const Model& model, const nlohmann::json& extra,
                     const std::function<void(size_t, float*)>& weight_f32, const SaveFormat& format) {
    ANVIL_CHECK(format.dtype == DType::F32 || format.dtype == DType::BF16 || format.dtype == DType::F16,
                "model weights are saved as F32, BF16 or F16, not {}", dtype_name(format.dtype));
    nlohmann::json cfg = config_to_hf_json(model.config(), extra);
    cfg["torch_dtype"] = format.dtype == DType::F32    ? "float32"
                         : format.dtype == DType::BF16 ? "bfloat16"
                                                       : "float16";
    const ParamStore& store = model.params();
    // int8 weights and their scales keep their dtype; every other tensor is written in the format's
    const auto file_dtype = [&](size_t i) {
        return store.spec(i).keep_dtype ? store.spec(i).dtype : format.dtype;
    };
    // the base model's entries (adapters are saved apart), cut into shards in store order
    std::vector<std::vector<size_t>> shards(1);
    uint64_t shard_bytes = 0, total = 0;
    for (size_t i = 0; i < store.size(); i++) {
        if (store.spec(i).adapter) continue;
        const uint64_t bytes = uint64_t(store.spec(i).full_shape().numel()) * dtype_size(file_dtype(i));
        if (!shards.back().empty() && shard_bytes + bytes > format.max_shard_bytes)
            shards.emplace_back(), shard_bytes = 0;
        shards.back().push_back(i);
        shard_bytes += bytes;
        total += bytes;
    }
    const size_t n = shards.size();
    nlohmann::json weight_map = nlohmann::json::object();
    std::vector<float> f32;
    for (size_t k = 0; k < n; k++) {
        const std::string file =
            n == 1 ? "model.safetensors" : fmt::format("model-{:05d}-of-{:05d}.safetensors", k + 1, n);
        std::vector<StMeta> metas;
        for (size_t i : shards[k]) {
            metas.push_back({store.spec(i).name, file_dtype(i), store.spec(i).full_shape().vec()});
            weight_map[store.spec(i).name] = file;
        }
        write_safetensors_streamed(
            dir + "/" + file, metas,
            [&](size_t m, void* dst) {
                const size_t i = shards[k][m];
                if (store.spec(i).dtype == DType::I8) return store.backend().download(dst, store.param(i));
                f32.resize(size_t(store.spec(i).full_shape().numel()));
                ANVIL_ASSERT(weight_f32 || !store.spec(i).shard.split());  // a piece alone is not the tensor
                if (weight_f32)
                    weight_f32(i, f32.data());
                else
                    f32 = store.read_f32(i);
                convert_from_f32(dst, file_dtype(i), f32.data(), f32.size());
            },
            {{"format", "pt"}});
    }
    if (n > 1)
        write_file_atomic(
            dir + "/model.safetensors.index.json",
            nlohmann::json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2) + "\n");
    write_file_atomic(dir + "/config.json", cfg.dump(2) + "\n");
}

void transpose(const float* in, float* out, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) out[c * rows + r] = in[r * cols + c];
}

}  // namespace anvil
