// Tensor parallelism on the model seam, in one process: K models on K threads, each holding its piece of
// every split layer, summing through a reducer over shared memory (the training code's reducer uses MPI or
// NCCL instead). Their losses equal one whole model's and their gradients, gathered, equal its gradients; a
// piece's initialisation is the whole model's slice; pieces reassemble whole.
#include <barrier>
#include <thread>

#include "harness.h"
#include "model_harness.h"

namespace anvil::test {
namespace {

// Sums over K threads in rank order (the same on every rank).
struct SharedSum {
    explicit SharedSum(int k) : K(k), slots(size_t(k)), sync(k) {}
    int K;
    std::vector<Tensor> slots;
    std::vector<float> total;
    std::barrier<> sync;
};

class ThreadReducer final : public TpReducer {
public:
    ThreadReducer(SharedSum& s, int rank) : s_(s), rank_(rank) {}
    void sum(Tensor t, const char*) override {
        s_.slots[size_t(rank_)] = t;
        s_.sync.arrive_and_wait();
        if (rank_ == 0) {
            s_.total.assign(size_t(t.numel()), 0.0f);
            for (const Tensor& x : s_.slots)
                for (size_t i = 0; i < s_.total.size(); i++) s_.total[i] += x.f32()[i];
        }
        s_.sync.arrive_and_wait();
        std::copy(s_.total.begin(), s_.total.end(), t.f32());
        s_.sync.arrive_and_wait();  // nobody starts the next sum before every rank has this one
    }

private:
    SharedSum& s_;
    int rank_;
};

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t k = 0; k < got.size(); k++)
        ASSERT_NEAR(got[k], want[k], 1e-5f + 1e-4f * std::fabs(want[k])) << what << "[" << k << "]";
}

// `base`: options of the whole model and of every piece (dropout)
void check_split_model(const ModelConfig& c, const char* split_entry, const ModelOptions& base = {}) {
    constexpr int K = 2;
    const uint64_t seed = test_seed();
    TinyRun whole(seed, base, c);
    SharedSum shared(K);
    std::vector<std::unique_ptr<TinyRun>> ranks;
    for (int r = 0; r < K; r++) {
        ModelOptions mo = base;
        mo.tp = {r, K, std::make_shared<ThreadReducer>(shared, r)};
        ranks.push_back(std::make_unique<TinyRun>(seed, mo, c));
    }
    // the initialisations first (drawn whole, sliced); then every path, biases too, given signal, each rank
    // taking its slice of the shaken whole
    const std::vector<std::vector<float>> init = all_params(whole.model->params());
    whole.shake(seed + 1, 0.3f);
    const double whole_loss = whole.loss(true);
    for (auto& run : ranks) {
        ParamStore& rs = run->model->params();
        for (size_t i = 0; i < rs.size(); i++) {
            std::vector<float> piece = init[i];
            keep_shard(rs.spec(i), piece);
            ASSERT_EQ(rs.read_f32(i), piece) << rs.spec(i).name << ": a piece's init is not its slice of the whole init";
            piece = whole.model->params().read_f32(i);
            keep_shard(rs.spec(i), piece);
            rs.write_f32(i, piece.data());
        }
    }
    std::vector<double> loss(K);
    std::vector<std::thread> threads;
    for (int r = 0; r < K; r++)
        threads.emplace_back([&, r] { loss[size_t(r)] = ranks[size_t(r)]->loss(true); });
    for (auto& t : threads) t.join();
    const ParamStore& ws = whole.model->params();
    bool saw_split = false;
    for (size_t i = 0; i < ws.size(); i++) {
        const std::string& name = ws.spec(i).name;
        const std::vector<float> want_w = ws.read_f32(i), want_g = download(*whole.be, ws.grad(i));
        std::vector<float> got_w(want_w.size()), got_g(want_g.size());
        for (int r = 0; r < K; r++) {
            const ParamStore& rs = ranks[size_t(r)]->model->params();
            const ParamSpec& s = rs.spec(i);
            ASSERT_EQ(s.name, name);
            ASSERT_TRUE(s.full_shape() == ws.spec(i).shape) << name;
            const std::vector<float> w = rs.read_f32(i), g = download(*ranks[size_t(r)]->be, rs.grad(i));
            if (!s.shard.split()) {  // whole on every rank: the same values and gradients as one model
                expect_close(w, want_w, name + " (rank " + std::to_string(r) + ")");
                expect_close(g, want_g, name + ".grad (rank " + std::to_string(r) + ")");
                continue;
            }
            saw_split = saw_split || name.find(split_entry) != std::string::npos;
            put_shard(s, r, w.data(), got_w.data());
            put_shard(s, r, g.data(), got_g.data());
        }
        if (!ranks[0]->model->params().spec(i).shard.split()) continue;
        ASSERT_EQ(got_w, want_w) << name << ": the pieces do not reassemble the whole";
        expect_close(got_g, want_g, name + ".grad (gathered)");
    }
    EXPECT_TRUE(saw_split) << split_entry << " is not split";
    for (int r = 0; r < K; r++) EXPECT_NEAR(loss[size_t(r)], whole_loss, 1e-6 * std::fabs(whole_loss));
}

TEST(TensorParallel, Gpt2PiecesEqualTheWholeModel) {
    check_split_model(tiny(), "attn.c_attn.weight");
}

TEST(TensorParallel, LlamaWithGqaPiecesEqualTheWholeModel) {
    check_split_model(tiny_llama(), "self_attn.k_proj.weight");
}

// With dropout (nanoGPT's: residual branches and attention probabilities) the pieces draw the whole model's
// masks: the branches' after the sum, the probabilities' by head numbers counted across the ranks.
TEST(TensorParallel, PiecesDropWhatTheWholeModelDrops) {
    ModelOptions drop;
    drop.dropout = drop.attn_dropout = 0.2f;
    check_split_model(tiny(), "attn.c_attn.weight", drop);
    check_split_model(tiny_llama(), "self_attn.k_proj.weight", drop);
}

// Biases on every projection (Llama's attention_bias and mlp_bias): q/k/v/gate/up's split with their columns,
// o/down's whole, added once.
TEST(TensorParallel, LlamaWithBiasesPiecesEqualTheWholeModel) {
    ModelConfig c = tiny_llama();
    c.qkv_bias = c.o_bias = c.mlp_bias = true;
    check_split_model(c, "self_attn.k_proj.bias");
}

TEST(TensorParallel, RefusesShapesThatDoNotSplit) {
    auto be = make_backend({Device::CPU, 1, 0});
    SharedSum shared(3);
    ModelOptions mo;
    mo.tp = {0, 3, std::make_shared<ThreadReducer>(shared, 0)};
    expect_error([&] { make_model(*be, tiny(), mo); }, "attention heads do not split evenly over 3 ranks");
}

}  // namespace
}  // namespace anvil::test
