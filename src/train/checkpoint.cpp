#include "train/checkpoint.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <map>

#include "core/hash.h"
#include "io/fs.h"
#include "io/json_text.h"
#include "io/safetensors.h"
#include "model/model_io.h"
#include "train/autobatch.h"  // parse_bytes
#include "train/run_setup.h"

namespace anvil {

namespace fsys = std::filesystem;

namespace {

int checkpoint_step(const std::string& dir) {
    const std::string p = dir + "/trainer_state.json";
    if (!file_exists(p)) return -1;
    return read_json_file(p).value("step", -1);
}

std::vector<int64_t> dims(const Shape& s) {
    return {s.dims.begin(), s.dims.begin() + s.ndim};
}

std::string shape_str(const Shape& s) {
    return s.str();
}

}  // namespace

std::string resolve_checkpoint(const std::string& dir, const char* flag) {
    ANVIL_CHECK(dir_exists(dir), "{} {}: no such directory", flag, dir);
    if (file_exists(dir + "/trainer_state.json")) return dir;
    std::string best;
    int best_step = -1;
    for (const auto& e : fsys::directory_iterator(dir)) {
        if (!e.is_directory()) continue;
        const std::string name = e.path().filename().string();
        if (name != "final" && !name.starts_with("checkpoint-")) continue;
        if (name.find(".tmp.") != std::string::npos || name.find(".old.") != std::string::npos) continue;
        const int s = checkpoint_step(e.path().string());
        if (s > best_step) {
            best_step = s;
            best = e.path().string();
        }
    }
    ANVIL_CHECK(!best.empty(),
                "{} {}: no training checkpoint here (a directory with trainer_state.json, or a run directory "
                "holding checkpoint-N or final)",
                flag, dir);
    return best;
}

ResumePoint read_resume_point(const std::string& resume_arg) {
    ResumePoint r;
    r.dir = resolve_checkpoint(resume_arg);
    r.state = read_json_file(r.dir + "/trainer_state.json");
    r.adapter = file_exists(r.dir + "/adapter_config.json") && !file_exists(r.dir + "/config.json");
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

void write_optimizer_state(const std::string& dir, const ParamStore& store,
                           const std::function<void(size_t, float*, float*)>& moments) {
    std::vector<StMeta> metas;
    for (size_t i : store.trainable()) {
        metas.push_back({"exp_avg." + store.spec(i).name, DType::F32, dims(store.spec(i).full_shape())});
        metas.push_back({"exp_avg_sq." + store.spec(i).name, DType::F32, dims(store.spec(i).full_shape())});
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

void load_optimizer_state(const std::string& dir, const ParamStore& store, AdamW& opt) {
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
            ANVIL_CHECK(e->shape == dims(spec.full_shape()) && e->known && e->dtype == DType::F32,
                        "{}: tensor \"{}\" must be F32 of shape {}", path, name,
                        shape_str(spec.full_shape()));
            mv[k].resize(size_t(spec.full_shape().numel()));
            std::memcpy(mv[k].data(), st.raw(*e), mv[k].size() * sizeof(float));
            keep_shard(spec, mv[k]);  // tensor parallel: this rank's piece
        }
        // the part in this rank's range (ZeRO-1 reshards here)
        opt.set_moments(i, mv[0].data(), mv[1].data());
    }
}

nlohmann::json scaler_to_json(const LossScaler& s) {
    return {{"scale", s.scale}, {"good_steps", s.good}};
}

void scaler_from_json(const nlohmann::json& state, LossScaler& s) {
    if (!s.enabled || !state.contains("loss_scale")) return;
    s.scale = state["loss_scale"].value("scale", s.scale);
    s.good = state["loss_scale"].value("good_steps", 0);
}

namespace {
// Keeps the newest `keep` checkpoint-N directories of `out` (temporaries never count).
void drop_old_checkpoints(const std::string& out, int keep) {
    if (keep <= 0) return;
    std::vector<std::pair<int, std::string>> ckpts;
    for (const auto& e : fsys::directory_iterator(out)) {
        const std::string n = e.path().filename().string();
        if (!e.is_directory() || !n.starts_with("checkpoint-") || n.find('.') != std::string::npos) continue;
        ckpts.emplace_back(std::atoi(n.c_str() + 11), e.path().string());
    }
    std::sort(ckpts.begin(), ckpts.end());
    for (size_t i = 0; i + size_t(keep) < ckpts.size(); i++) {
        std::error_code ec;
        fsys::remove_all(ckpts[i].second, ec);
    }
}

// What a checkpoint holds of the training state, as rank 0 writes it: ZeRO-1's ranges of the moments and the
// f32 master weights gathered from every replica, tensor-parallel pieces gathered whole. Every rank builds
// one (the gathering is collective).
class SavedState {
public:
    explicit SavedState(const RunSetup& run) : opt_(*run.opt), store_(run.model->params()) {
        if (opt_.sharded()) run.dp->gather_state(m_all_, v_all_, master_all_);
        if (Comm* tp = run.grid.tp) gather_pieces(*tp);
    }
    // An entry's f32 weights as this rank holds them (its tensor-parallel piece) or whole.
    void local_weights(size_t i, float* dst) const {
        if (master_all_.empty() || !store_.spec(i).trainable || store_.spec(i).dtype == DType::F32)
            return opt_.weights_f32(i, dst);
        std::copy_n(master_all_.data() + opt_.offset(i), size_t(store_.spec(i).shape.numel()), dst);
    }
    void weights(size_t i, float* dst) const {
        if (const auto it = w_whole_.find(i); it != w_whole_.end())
            return (void)std::copy(it->second.begin(), it->second.end(), dst);
        local_weights(i, dst);
    }
    void moments(size_t i, float* m, float* v) const {
        if (const auto it = m_whole_.find(i); it != m_whole_.end()) {
            std::copy(it->second.begin(), it->second.end(), m);
            std::copy(v_whole_.at(i).begin(), v_whole_.at(i).end(), v);
            return;
        }
        local_moments(i, m, v);
    }
    // A hash of every weight the optimizer updates (whole_only: of the entries tensor parallelism does not
    // split): data-parallel replicas must agree on all of them bit for bit, a tensor-parallel group on the
    // whole ones.
    uint64_t hash(bool whole_only) const {
        uint64_t h = kFnvOffset;
        std::vector<float> w;
        for (size_t i : store_.trainable()) {
            if (whole_only && store_.spec(i).shard.split()) continue;
            w.resize(size_t(store_.spec(i).shape.numel()));
            local_weights(i, w.data());
            for (float x : w) h = fnv1a_mix(h, std::bit_cast<uint32_t>(x));
        }
        return h;
    }

private:
    void local_moments(size_t i, float* m, float* v) const {
        if (!opt_.sharded()) return opt_.moments(i, m, v);
        const size_t n = size_t(store_.spec(i).shape.numel());
        std::copy_n(m_all_.data() + opt_.offset(i), n, m);
        std::copy_n(v_all_.data() + opt_.offset(i), n, v);
    }
    // tensor parallel: the split entries' weights and moments gathered whole, by store index
    void gather_pieces(Comm& tp) {
        std::vector<float> w, m, v;
        for (size_t i = 0; i < store_.size(); i++) {
            const ParamSpec& s = store_.spec(i);
            if (!s.shard.split()) continue;
            w.resize(size_t(s.shape.numel()));
            local_weights(i, w.data());
            gather_whole(tp, s, w.data(), w_whole_[i]);
            if (!s.trainable) continue;
            m.resize(w.size());
            v.resize(w.size());
            local_moments(i, m.data(), v.data());
            gather_whole(tp, s, m.data(), m_whole_[i]);
            gather_whole(tp, s, v.data(), v_whole_[i]);
        }
    }
    const AdamW& opt_;
    const ParamStore& store_;
    std::vector<float> m_all_, v_all_, master_all_;  // ZeRO-1: every replica's range, gathered
    std::map<size_t, std::vector<float>> w_whole_, m_whole_, v_whole_;
};
}  // namespace

void save_checkpoint(const RunSetup& run, int step, const std::string& name) {
    Comm& comm = *run.comm;
    const SavedState saved(run);
    if (comm.size() > 1) {  // the replicas must not have drifted apart; rank 0 then writes for all
        check_same(*run.grid.dp, saved.hash(false),
                   fmt::format("the weights at step {} (the replicas drifted apart)", step));
        if (run.grid.tp)
            check_same(*run.grid.tp, saved.hash(true),
                       fmt::format("the unsplit weights at step {} (the tensor-parallel ranks drifted apart)",
                                   step));
        if (comm.rank() != 0) return;
    }
    const TrainOptions& o = run.opts;
    const std::string dir = o.out + "/" + name;
    const std::string tmp = temp_dir_for(dir);
    make_dirs(tmp);
    const auto weights = [&](size_t i, float* dst) { saved.weights(i, dst); };
    // a LoRA run saves its adapter in PEFT's format; the base stays where it is
    if (run.model->has_adapters())
        write_peft_adapter(tmp, *run.model, std::filesystem::absolute(o.init).lexically_normal().string(),
                           weights);
    else
        write_model_dir(tmp, *run.model,
                        {{"anvil_tokenizer", run.tok->kind()}, {"anvil_template", o.prompt_template}},
                        weights, SaveFormat{DType::F32, parse_bytes(o.max_shard_size, "--max-shard-size")});
    run.tok->save(tmp);
    write_optimizer_state(tmp, run.model->params(),
                          [&](size_t i, float* m, float* v) { saved.moments(i, m, v); });
    nlohmann::json state = {
        {"step", step},
        {"world_size", comm.size()},
        {"options", options_to_json(o)},
        {"data",
         {{"path", o.data},
          {"fingerprint", fmt::format("{:016x}", run.data.fingerprint)},
          {"train_tokens", run.data.train.size()}}},
    };
    if (run.trainer->scaler().enabled) state["loss_scale"] = scaler_to_json(run.trainer->scaler());
    const OutlierState& z = run.trainer->outliers();
    if (!z.loss.values().empty())  // --skip-loss-z/--skip-grad-z's windows, oldest first
        state["outlier_windows"] = {
            {"loss", std::vector<double>(z.loss.values().begin(), z.loss.values().end())},
            {"grad_norm", std::vector<double>(z.grad.values().begin(), z.grad.values().end())}};
    if (run.best.step > 0)
        state["best"] = {{"step", run.best.step},
                         {"val_loss", run.best.loss},
                         {"evals_since", run.best.evals_since},
                         {"dir", run.best.dir}};
    write_file_atomic(tmp + "/trainer_state.json", json_text(state, 2) + "\n");
    replace_dir(tmp, dir);
    drop_old_checkpoints(o.out, o.keep_checkpoints);
}

}  // namespace anvil
