#include "runtime/checkpoint.h"

#include <cstring>
#include <vector>

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

}  // namespace

void write_checkpoint(const std::string& dir, const CheckpointContents& c) {
    const std::string tmp = temp_dir_for(dir);
    make_dirs(tmp);
    if (c.model->has_adapters())  // a LoRA run saves its adapter in PEFT's format; the base stays where it is
        write_peft_adapter(tmp, *c.model, c.lora_base, c.weights);
    else
        write_model_dir(tmp, *c.model, c.config_extra, c.weights, c.format);
    c.tok->save(tmp);
    write_optimizer_state(tmp, c.model->params(), c.moments);
    write_file_atomic(tmp + "/trainer_state.json", json_text(c.state, 2) + "\n");
    replace_dir(tmp, dir);
}

ResumePoint read_resume_point(const std::string& resume_arg) {
    ResumePoint r;
    r.dir = resolve_checkpoint(resume_arg);
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

}  // namespace anvil
