#include "runtime/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "io/checksum.h"
#include "io/fs.h"
#include "io/json_text.h"
#include "io/safetensors.h"
#include "model/lora.h"
#include "runtime/run_dir.h"

namespace anvil {

namespace {

// optimizer.safetensors: every trainable entry's moments, whole
void write_optimizer_state(const std::string& dir, const ParamStore& store,
                           const std::function<void(size_t, float*, float*)>& moments) {
    std::vector<StMeta> metas;
    for (size_t i : store.trainable()) {
        metas.push_back({"exp_avg." + store.spec(i).name, DType::F32, store.spec(i).full_shape().vec()});
        metas.push_back({"exp_avg_sq." + store.spec(i).name, DType::F32, store.spec(i).full_shape().vec()});
    }
    const std::vector<size_t>& tr = store.trainable();
    std::vector<float> other;
    write_safetensors_streamed(dir + "/optimizer.safetensors", metas, [&](size_t k, void* dst) {
        const size_t i = tr[k / 2];
        other.resize(size_t(store.spec(i).full_shape().numel()));
        float* out = static_cast<float*>(dst);
        if (k % 2 == 0)
            moments(i, out, other.data());
        else
            moments(i, other.data(), out);
    });
}

constexpr const char* kFp8File = "fp8_state.safetensors";
constexpr const char* kFp8Tensor = "fp8_amax_history";

// fp8_state.safetensors: FP8 delayed scaling's histories (Model::fp8_state), as they stand
void write_fp8_state(const std::string& dir, const Model& m) {
    const Tensor t = m.fp8_state();
    const std::vector<float> v = m.backend().download_f32(t);
    write_safetensors_streamed(
        dir + "/" + kFp8File, {{kFp8Tensor, DType::F32, t.shape.vec()}},
        [&](size_t, void* dst) { std::memcpy(dst, v.data(), v.size() * sizeof(float)); });
}

}  // namespace

void write_checkpoint(const std::string& dir, const CheckpointContents& c) {
    const std::string tmp = temp_dir_for(dir);
    try {
        make_dirs(tmp);
        if (c.model->has_adapters())  // a LoRA run saves its adapter in PEFT's format; the base stays
            write_peft_adapter(tmp, *c.model, c.lora_base, c.weights);
        else
            write_model_dir(tmp, *c.model, c.config_extra, c.weights, c.format);
        c.tok->save(tmp);
        write_optimizer_state(tmp, c.model->params(), c.moments);
        if (!c.model->fp8_state().empty()) write_fp8_state(tmp, *c.model);
        std::vector<std::string> names;  // the manifest: every file but trainer_state.json, which holds it
        for (const auto& e : std::filesystem::directory_iterator(tmp))
            if (e.is_regular_file()) names.push_back(e.path().filename().string());
        std::sort(names.begin(), names.end());
        nlohmann::json state = c.state;
        state["files"] = file_manifest(tmp, names);
        write_file_atomic(tmp + "/trainer_state.json", json_text(state, 2) + "\n");
        replace_dir(tmp, dir);
    } catch (const Error& e) {
        std::error_code ec;
        std::filesystem::remove_all(tmp, ec);
        fail("saving the checkpoint {} failed, and what it had written is removed (the run's earlier "
             "checkpoints are untouched): {}",
             dir, e.what());
    }
}

namespace {

// "" when the checkpoint's files match its manifest (one written before manifests were kept passes
// unchecked), else what is wrong: an unreadable trainer_state.json, a missing, truncated or changed file.
std::string check_checkpoint(const std::string& dir) {
    nlohmann::json state;
    try {
        state = read_json_file(dir + "/trainer_state.json");
    } catch (const Error& e) {
        return e.what();
    }
    if (!state.contains("files")) return "";  // written before checkpoints kept a manifest
    return check_manifest(dir, state["files"]);
}

ResumePoint read_checked(const std::string& dir) {
    ResumePoint r;
    r.dir = dir;
    r.state = read_json_file(r.dir + "/trainer_state.json");
    r.adapter = is_adapter_dir(r.dir);
    if (!r.adapter) {
        r.config = read_model_config(r.dir);
        return r;
    }
    const std::string base = r.state.value("options", nlohmann::json::object()).value("init", std::string());
    ANVIL_CHECK(!base.empty(),
                "--resume {}: a LoRA checkpoint whose trainer_state.json names no base (--init)", r.dir);
    r.config = read_model_config(base);
    return r;
}

}  // namespace

std::optional<ResumePoint> find_resume_point(const std::string& resume_arg, bool optional) {
    if (file_exists(resume_arg + "/trainer_state.json")) {
        const std::string bad = check_checkpoint(resume_arg);
        ANVIL_CHECK(bad.empty(),
                    "--resume {}: the checkpoint is damaged ({}); resume from the run directory to take its "
                    "newest undamaged checkpoint, or name an earlier checkpoint-N",
                    resume_arg, bad);
        return read_checked(resume_arg);
    }
    const std::vector<std::string> all = list_checkpoints(resume_arg);
    if (all.empty() && optional) return std::nullopt;
    ANVIL_CHECK(dir_exists(resume_arg), "--resume {}: no such directory", resume_arg);
    ANVIL_CHECK(!all.empty(),
                "--resume {}: no training checkpoint here (a directory with trainer_state.json, or a run "
                "directory holding checkpoint-N or final)",
                resume_arg);
    for (const std::string& dir : all) {
        const std::string bad = check_checkpoint(dir);
        if (bad.empty()) return read_checked(dir);
        std::fprintf(stderr, "anvil: --resume: skipping %s, which is damaged (%s)\n", dir.c_str(),
                     bad.c_str());
    }
    fail("--resume {}: every checkpoint in it is damaged (named above); start the run again", resume_arg);
}

void read_optimizer_state(const std::string& dir, const ParamStore& store,
                          const std::function<void(size_t, const float*, const float*)>& set) {
    const std::string path = dir + "/optimizer.safetensors";
    ANVIL_CHECK(
        file_exists(path),
        "{}: missing; --resume needs a training checkpoint (it holds the optimizer state), or use --init "
        "to start a new run from the weights",
        path);
    SafetensorsReader st(path);
    for (size_t i : store.trainable()) {
        std::vector<float> mv[2];  // copied: the file's bytes need not be aligned for floats
        for (int k = 0; k < 2; k++) {
            const std::string name = (k == 0 ? "exp_avg." : "exp_avg_sq.") + store.spec(i).name;
            const StEntry* e = st.find(name);
            ANVIL_CHECK(e, "{}: tensor \"{}\" is missing", path, name);
            const ParamSpec& spec = store.spec(i);
            ANVIL_CHECK(e->shape == spec.full_shape().vec() && e->known && e->dtype == DType::F32,
                        "{}: tensor \"{}\" must be F32 of shape {}", path, name, spec.full_shape().str());
            mv[k].resize(size_t(spec.full_shape().numel()));
            std::memcpy(mv[k].data(), st.raw(*e), mv[k].size() * sizeof(float));
            keep_shard(spec, mv[k]);  // tensor parallel: this rank's piece
        }
        set(i, mv[0].data(), mv[1].data());
    }
}

bool read_fp8_state(const std::string& dir, Model& m) {
    const Tensor t = m.fp8_state();
    const std::string path = dir + "/" + kFp8File;
    if (t.empty() || !file_exists(path)) return false;
    SafetensorsReader st(path);
    const StEntry* e = st.find(kFp8Tensor);
    ANVIL_CHECK(e && e->known && e->dtype == DType::F32, "{}: tensor \"{}\" (F32) is missing", path,
                kFp8Tensor);
    ANVIL_CHECK(
        e->shape == t.shape.vec(),
        "{}: FP8 histories of {} values where this run keeps {} ({} values: its --fp8-history differs from "
        "the run that wrote the checkpoint: resume with the same --fp8-history)",
        path, e->numel(), t.shape.str(), t.numel());
    std::vector<float> v(size_t(t.numel()));
    std::memcpy(v.data(), st.raw(*e), v.size() * sizeof(float));
    m.backend().upload(t, v.data());
    return true;
}

}  // namespace anvil
