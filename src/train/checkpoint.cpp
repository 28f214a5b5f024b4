#include "train/checkpoint.h"

#include <algorithm>
#include <bit>
#include <filesystem>
#include <map>

#include "core/hash.h"
#include "core/sizes.h"
#include "train/run_setup.h"

namespace anvil {

namespace fsys = std::filesystem;

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

void save_checkpoint(const RunSetup& run, int64_t step, const std::string& name) {
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
    CheckpointContents c;
    c.model = run.model.get();
    c.tok = run.tok.get();
    if (run.model->has_adapters()) c.lora_base = fsys::absolute(o.init).lexically_normal().string();
    c.config_extra = {{"anvil_tokenizer", run.tok->kind()}, {"anvil_template", o.prompt_template}};
    c.format = SaveFormat{DType::F32, parse_bytes(o.max_shard_size, "--max-shard-size")};
    c.weights = [&](size_t i, float* dst) { saved.weights(i, dst); };
    c.moments = [&](size_t i, float* m, float* v) { saved.moments(i, m, v); };
    c.state = {
        {"step", step},
        {"world_size", comm.size()},
        {"options", options_to_json(o)},
        {"data",
         {{"path", o.data},
          {"fingerprint", fmt::format("{:016x}", run.data.fingerprint)},
          {"train_tokens", run.data.train.size()}}},
    };
    if (run.trainer->scaler().enabled) c.state["loss_scale"] = scaler_to_json(run.trainer->scaler());
    const OutlierState& z = run.trainer->outliers();
    if (!z.loss.values().empty())  // --skip-loss-z/--skip-grad-z's windows, oldest first
        c.state["outlier_windows"] = {
            {"loss", std::vector<double>(z.loss.values().begin(), z.loss.values().end())},
            {"grad_norm", std::vector<double>(z.grad.values().begin(), z.grad.values().end())}};
    if (run.best.step > 0)
        c.state["best"] = {{"step", run.best.step},
                           {"val_loss", run.best.loss},
                           {"evals_since", run.best.evals_since},
                           {"dir", run.best.dir}};
    write_checkpoint(o.out + "/" + name, c);
    drop_old_checkpoints(o.out, o.keep_checkpoints);
}

}  // namespace anvil
