// Serving: batched decoding over cache slots against one sequence at a time, the continuous-batching
// scheduler against the plain generator, the OpenAI request checks, the streamed text's stop strings and the
// API keys.
#include <thread>

#include "data/text_stream.h"
#include "io/fs.h"
#include "model/generate.h"
#include "model_harness.h"
#include "serve/auth.h"
#include "serve/openai.h"
#include "serve/scheduler.h"

namespace anvil::test {
namespace {

std::unique_ptr<Model> random_model(Backend& be, ModelConfig c) {
    c.n_ctx = 16;
    auto m = make_model(be, c);
    m->params().init(test_seed());
    auto params = all_params(m->params());
    std::mt19937_64 g(test_seed() + 1);
    for (auto& p : params)  // weights well away from init, so the logits differ across positions
        for (auto& x : p) x += 0.5f * std::normal_distribution<float>(0.0f, 1.0f)(g);
    set_all_params(m->params(), params);
    return m;
}

// Three sequences of different lengths in slots 2, 0, 1 of one cache, decoded together for 6 steps, against
// each decoded alone in a cache of its own: the same logits.
void batched_rows_equal_single(const ModelConfig& c) {
    auto be = make_backend({Device::CPU, 2, 0});
    auto m = random_model(*be, c);
    const int V = m->config().vocab_size;
    const std::vector<std::vector<int32_t>> prompts = {{3, 1, 4, 1, 5}, {9}, {2, 6, 5}};
    const std::vector<int> slots = {2, 0, 1};
    const int B = int(prompts.size()), steps = 6;

    auto prefill = m->make_activations(1, m->config().n_ctx, ActMode::Decode);
    auto run_one = [&](KvCache& cache, int slot, const std::vector<int32_t>& ids, int pos0) {
        ForwardPass f{.tokens = prefill->get(act::tokens, 1, int(ids.size()))};
        be->upload(f.tokens, ids.data());
        f.pos0 = pos0;
        f.cache = &cache;
        f.slot = slot;
        f.last_logits = true;
        m->forward(*prefill, f);
        return download(*be, prefill->get(act::logits, 1, 1));
    };
    // alone: each sequence greedy for `steps` tokens, its logits at every step
    std::vector<std::vector<std::vector<float>>> alone(static_cast<size_t>(B));
    std::vector<std::vector<int32_t>> fed(static_cast<size_t>(B));
    for (int b = 0; b < B; b++) {
        auto own = m->make_cache();
        std::vector<float> l = run_one(*own, 0, prompts[size_t(b)], 0);
        int pos = int(prompts[size_t(b)].size());
        for (int s = 0; s < steps; s++) {
            const int32_t next = int32_t(std::max_element(l.begin(), l.end()) - l.begin());
            fed[size_t(b)].push_back(next);
            l = run_one(*own, 0, {next}, pos++);
            alone[size_t(b)].push_back(l);
        }
    }
    // together: prefill into the pool's slots (each alone, or all packed in one forward), then one batched
    // pass per step
    for (const auto& [packed, paged] : {std::pair{false, false}, {true, false}, {true, true}}) {
        const auto together = decode_rows(
            *m, prompts, slots, steps, [&](int b, int s) { return fed[size_t(b)][size_t(s)]; }, packed,
            paged);
        double worst = 0.0;
        for (int s = 0; s < steps; s++)
            for (int b = 0; b < B; b++)
                for (int v = 0; v < V; v++)
                    worst = std::max(worst, double(std::abs(together[size_t(s)][size_t(b * V + v)] -
                                                            alone[size_t(b)][size_t(s)][size_t(v)])));
        EXPECT_LT(worst, 1e-5) << "batched rows against one sequence at a time"
                               << (packed ? ", packed prefill" : "") << (paged ? ", shuffled pages" : "");
    }
}

TEST(BatchedDecode, RowsEqualOneSequenceAtATime) {
    batched_rows_equal_single(tiny());
}
TEST(BatchedDecode, RowsEqualOneSequenceAtATimeLlama) {
    batched_rows_equal_single(tiny_llama());
}

// What the scheduler did, in order: "first" for a sequence's first token, the decoding rows of each forward
// that had some, and every forward's rows.
struct StepLog : serve::SchedulerObserver {
    std::vector<int> events;                  // 0: a first token; n > 0: a forward with n decoding rows
    std::vector<std::pair<int, int>> passes;  // (decoding rows, prompt positions) of each forward
    int preemptions = 0, cached = 0;          // preemptions; positions found in the prefix cache
    void on_first_token(double) override { events.push_back(0); }
    void on_preempt() override { preemptions++; }
    void on_cached(int found) override { cached += found; }
    void on_next_token(double) override {}
    void on_pass(int decode_rows, int prompt_rows) override {
        if (decode_rows > 0) events.push_back(decode_rows);
        passes.emplace_back(decode_rows, prompt_rows);
    }
};

// Requests through the scheduler (two slots, so they queue, join and leave while others run) give the
// generator's tokens: greedy and seeded sampling, stop tokens, length limits. With prompts in pieces of
// `chunk` positions (0: whole), the generator cutting them alike. kv_pages > 0: more slots, but a KV cache of
// that many pages of kv_page positions, so requests wait for pages as well as slots, and running ones are
// preempted when the pool runs dry, then prefilled again from their prompt and answer so far. shared > 0:
// every prompt begins with the same `shared` tokens and two are equal, so with prefix caching (on unless
// `prefix_cache` is false) requests take the pages others filled.
struct Pool {
    int pages = 0, page = 16, shared = 0;
    bool prefix_cache = true;
};
void answers_equal_the_generator(int chunk, int longest_prompt, Pool pool = {}) {
    const int kv_pages = pool.pages, kv_page = pool.page;
    auto be = make_backend({Device::CPU, 2, 0});
    auto m = random_model(*be, tiny_llama());
    struct Case {
        std::vector<int32_t> prompt;
        SampleOptions opt;
    };
    std::vector<Case> cases;
    for (int i = 0; i < 7; i++) {
        Case c;
        for (int k = 0; k < pool.shared; k++) c.prompt.push_back(int32_t((7 + k * 4) % 11));
        for (int k = 0; k <= i % longest_prompt; k++) c.prompt.push_back(int32_t((i * 3 + k * 5) % 11));
        if (pool.shared > 0 && i == 6) c.prompt = cases[4].prompt;
        c.opt.max_new_tokens = std::min(3 + i, 15 - int(c.prompt.size()));
        c.opt.temperature = i % 2 ? 0.0f : 0.9f;
        c.opt.seed = uint64_t(100 + i);
        if (i == 5) c.opt.stop_tokens = {1, 2, 3};  // likely to end early
        cases.push_back(c);
    }
    std::vector<std::vector<int32_t>> want;
    {
        Generator gen(*m, chunk);
        for (const Case& c : cases) want.push_back(gen.generate(c.prompt, c.opt));
        for (size_t i = 0; i < want.size(); i++)  // the generator returns the stop token; the server does not
            if (!want[i].empty() &&
                std::count(cases[i].opt.stop_tokens.begin(), cases[i].opt.stop_tokens.end(), want[i].back()))
                want[i].pop_back();
    }
    // the greedy rows' choices on the host, then the backend's
    for (const bool device_greedy : {false, true}) {
        SCOPED_TRACE(device_greedy ? "greedy rows chosen by the backend" : "every row sampled on the host");
        serve::SchedulerOptions so;
        so.device_greedy_on_cpu = device_greedy;
        so.slots = kv_pages > 0 ? 4 : 2;
        so.max_queue = 16;
        so.prefill_chunk = chunk;
        so.kv_pages = kv_pages;
        so.kv_page = kv_page;
        so.prefix_caching = pool.prefix_cache;
        StepLog log;
        serve::Scheduler sched(*m, so, &log);
        std::vector<std::vector<int32_t>> got(cases.size());
        std::vector<serve::Finish> finish(cases.size());
        // every request queued before the model's thread starts: which ones outgrow the pages together
        // does not hang on how soon a client thread is scheduled
        std::vector<std::shared_ptr<serve::Sequence>> seqs;
        for (const Case& c : cases) seqs.push_back(sched.submit(c.prompt, c.opt));
        std::thread client([&] {
            for (size_t i = 0; i < seqs.size(); i++) {
                ASSERT_TRUE(seqs[i]);
                for (;;) {
                    serve::Sequence::Update u = seqs[i]->wait(got[i].size(), std::chrono::milliseconds(100));
                    got[i].insert(got[i].end(), u.tokens.begin(), u.tokens.end());
                    if (u.finish != serve::Finish::None) {
                        finish[i] = u.finish;
                        break;
                    }
                }
            }
            sched.stop();
        });
        sched.run();  // the model's thread is this one, as in anvil serve
        client.join();
        EXPECT_EQ(sched.load().pages_used, 0) << "every page back in the pool";
        if (kv_pages > 0) {  // the requests outgrow the pages: some are preempted and recomputed
            EXPECT_GT(log.preemptions, 0) << kv_pages << " pages of " << kv_page;
        } else {
            EXPECT_EQ(log.preemptions, 0);
        }
        if (pool.shared > 0 && pool.prefix_cache) {
            EXPECT_GE(log.cached, 4 * (pool.shared / kv_page) * kv_page)
                << "prefix pages taken from the cache";
        } else if (!pool.prefix_cache) {
            EXPECT_EQ(log.cached, 0);
        }
        for (size_t i = 0; i < cases.size(); i++) {
            EXPECT_EQ(got[i], want[i]) << "request " << i << ", prefill chunk " << chunk;
            const bool stopped = int(got[i].size()) < cases[i].opt.max_new_tokens;
            EXPECT_EQ(finish[i], stopped ? serve::Finish::Stop : serve::Finish::Length) << "request " << i;
        }
    }
}

TEST(Scheduler, AnswersEqualTheGenerator) {
    answers_equal_the_generator(kPrefillChunk, 4);
}
TEST(Scheduler, AnswersEqualTheGeneratorWithPromptsInChunks) {
    answers_equal_the_generator(3, 11);
    answers_equal_the_generator(0, 11);
}
TEST(Scheduler, AnswersEqualTheGeneratorInAFewPages) {
    answers_equal_the_generator(3, 11, {8, 2});             // one context of 16 positions: 8 pages of 2
    answers_equal_the_generator(kPrefillChunk, 4, {5, 4});  // one context: 4 pages of 4
    answers_equal_the_generator(3, 11, {8, 2, 0, false});   // and without prefix caching
}
// Prompts that begin alike: later requests start from pages earlier ones filled (while those run, or after
// they ended), and give the generator's answers all the same.
TEST(Scheduler, AnswersEqualTheGeneratorFromCachedPrefixes) {
    answers_equal_the_generator(kPrefillChunk, 4, {0, 2, 6});  // whole contexts a slot, pages of 2
    answers_equal_the_generator(3, 4, {0, 4, 7});              // pages of 4, prompts in pieces of 3
    answers_equal_the_generator(3, 4, {10, 2, 6});             // a few pages: some evicted, some preempted
    answers_equal_the_generator(3, 4, {0, 2, 6, false});
}

// The model's logits after each prefix of ids (position j's: given ids[0..j]), one position at a time in a
// cache of its own.
std::vector<std::vector<float>> logits_at_each_position(Model& m, const std::vector<int32_t>& ids) {
    auto acts = m.make_activations(1, 1, ActMode::Decode);
    auto cache = m.make_cache();
    std::vector<std::vector<float>> out;
    for (size_t j = 0; j < ids.size(); j++)
        out.push_back(forward_cached(m, *acts, *cache, 0, &ids[j], 1, int(j)));
    return out;
}

double log_softmax_at(const std::vector<float>& logits, int32_t id) {
    const float mx = *std::max_element(logits.begin(), logits.end());
    double sum = 0.0;
    for (const float x : logits) sum += std::exp(double(x - mx));
    return double(logits[size_t(id)] - mx) - std::log(sum);
}

// Log-probabilities through the scheduler (OpenAI's logprobs, and echo's of the prompt) are the model's own,
// before the penalties change the sampling: each prompt token's after the first, each sampled token's, and
// the likeliest beside them, whether a request is preempted and recomputed, or shares its prompt's first
// pages with another (a scored prompt computes its positions instead of taking them from the prefix cache).
TEST(Scheduler, LogprobsAreTheModelsThroughPreemptionAndCachedPrefixes) {
    auto be = make_backend({Device::CPU, 2, 0});
    auto m = random_model(*be, tiny_llama());
    const int V = m->config().vocab_size;
    serve::SchedulerOptions so;
    so.slots = 4;
    so.prefill_chunk = 3;
    so.kv_pages = 8;  // one context of 16 positions in pages of 2: some requests are preempted
    so.kv_page = 2;
    StepLog log;
    serve::Scheduler sched(*m, so, &log);
    struct Case {
        std::vector<int32_t> prompt;
        SampleOptions opt;
        LogprobRequest lp;
        std::vector<int32_t> tokens;
        std::vector<TokenLogprob> lps, prompt_lps;
    };
    std::vector<Case> cases(6);
    for (int i = 0; i < 6; i++) {
        Case& c = cases[size_t(i)];
        for (int k = 0; k < 4 + i; k++) c.prompt.push_back(int32_t(k < 4 ? 7 + k : (i * 3 + k * 5) % 11));
        c.opt.max_new_tokens = 12 - int(c.prompt.size());
        c.opt.temperature = 0.9f;
        c.opt.seed = uint64_t(20 + i);
        c.opt.presence_penalty = 1.5f;  // not in the reported values
        c.lp = {i % 3, i % 2 == 0};
    }
    cases[5].opt.max_new_tokens = 0;  // the prompt scored, nothing generated
    // all queued before the model's thread starts, so that they meet in the pages (and are preempted) however
    // late a client thread would have been scheduled to submit them
    std::vector<std::shared_ptr<serve::Sequence>> seqs;
    for (Case& c : cases) seqs.push_back(sched.submit(c.prompt, c.opt, c.lp));
    std::thread client([&] {
        for (size_t i = 0; i < seqs.size(); i++) {
            ASSERT_TRUE(seqs[i]);
            for (;;) {
                serve::Sequence::Update u =
                    seqs[i]->wait(cases[i].tokens.size(), std::chrono::milliseconds(100));
                cases[i].tokens.insert(cases[i].tokens.end(), u.tokens.begin(), u.tokens.end());
                for (TokenLogprob& t : u.logprobs) cases[i].lps.push_back(std::move(t));
                if (u.finish != serve::Finish::None) break;
            }
            cases[i].prompt_lps = seqs[i]->prompt_logprobs();
        }
        sched.stop();
    });
    sched.run();
    client.join();
    EXPECT_GT(log.preemptions, 0);
    EXPECT_GT(log.cached, 0) << "the unscored requests share the prompts' first pages";
    double worst = 0.0;
    for (size_t i = 0; i < cases.size(); i++) {
        const Case& c = cases[i];
        std::vector<int32_t> all = c.prompt;
        all.insert(all.end(), c.tokens.begin(), c.tokens.end());
        const auto want = logits_at_each_position(*m, all);
        const size_t P = c.prompt.size();
        ASSERT_EQ(c.lps.size(), c.tokens.size()) << "request " << i;
        ASSERT_EQ(c.prompt_lps.size(), c.lp.prompt ? P - 1 : 0) << "request " << i;
        const auto check = [&](const TokenLogprob& t, int32_t id, const std::vector<float>& logits) {
            EXPECT_EQ(t.token, id);
            worst = std::max(worst, std::abs(double(t.logprob) - log_softmax_at(logits, id)));
            ASSERT_EQ(int(t.top.size()), std::min(c.lp.top, V)) << "request " << i;
            for (size_t k = 0; k < t.top.size(); k++) {
                worst = std::max(worst,
                                 std::abs(double(t.top[k].second) - log_softmax_at(logits, t.top[k].first)));
                if (k > 0) {
                    EXPECT_GE(t.top[k - 1].second, t.top[k].second);
                }
            }
            if (!t.top.empty()) {
                EXPECT_EQ(t.top[0].first,
                          int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()));
            }
        };
        for (size_t k = 1; k < P && c.lp.prompt; k++) check(c.prompt_lps[k - 1], c.prompt[k], want[k - 1]);
        for (size_t k = 0; k < c.tokens.size(); k++) check(c.lps[k], c.tokens[k], want[P - 1 + k]);
    }
    EXPECT_TRUE(cases[5].tokens.empty());
    EXPECT_LT(worst, 1e-4) << "log-probabilities against the model's logits, position by position";
}

// Serves on this thread until every one of `seqs` has ended.
void run_until_ended(serve::Scheduler& sched, std::vector<std::shared_ptr<serve::Sequence>> seqs) {
    std::thread client([&] {
        for (const auto& s : seqs)
            while (s->wait(0, std::chrono::seconds(10)).finish == serve::Finish::None) {
            }
        sched.stop();
    });
    sched.run();
    client.join();
}

// A long prompt is prefilled a chunk per step while a running sequence keeps decoding; whole, it is one
// stall.
TEST(Scheduler, ChunkedPrefillKeepsRunningSequencesDecoding) {
    auto be = make_backend({Device::CPU, 2, 0});
    auto m = random_model(*be, tiny());
    for (int chunk : {2, 0}) {
        serve::SchedulerOptions so;
        so.slots = 2;
        so.prefill_chunk = chunk;
        StepLog log;
        serve::Scheduler sched(*m, so, &log);
        SampleOptions greedy;
        greedy.temperature = 0.0f;
        greedy.max_new_tokens = 12;
        auto a = sched.submit({5}, greedy);  // both wait before the scheduler starts: one admission
        greedy.max_new_tokens = 2;
        auto b = sched.submit({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2}, greedy);
        ASSERT_TRUE(a && b);
        run_until_ended(sched, {a, b});
        const serve::Sequence::Update ub = b->wait(0, std::chrono::seconds(1));
        EXPECT_EQ(ub.finish, serve::Finish::Length) << ub.error;
        // a's first token, then decode steps of a alone until b's prompt is in
        ASSERT_GE(log.events.size(), 3u);
        EXPECT_EQ(log.events[0], 0);
        const size_t b_first =
            size_t(std::find(log.events.begin() + 1, log.events.end(), 0) - log.events.begin());
        ASSERT_LT(b_first, log.events.size());
        const long alone =
            std::count(log.events.begin() + 1, log.events.begin() + std::ptrdiff_t(b_first), 1);
        using Pass = std::pair<int, int>;
        if (chunk == 2) {
            EXPECT_EQ(alone, 5) << "12 positions in chunks of 2: one with a's prefill, then 5 steps' worth";
            // one forward an iteration: a's prompt with b's first piece, then a's next token beside each of
            // b's other pieces (the last one ending b's prompt), then both decoding
            ASSERT_GE(log.passes.size(), 7u);
            EXPECT_EQ(log.passes[0], Pass(0, 3));
            for (size_t k = 1; k < 6; k++) EXPECT_EQ(log.passes[k], Pass(1, 2)) << k;
            EXPECT_EQ(log.passes[6], Pass(2, 0));
        } else {
            EXPECT_EQ(alone, 0) << "a whole prompt is prefilled before the first step";
            ASSERT_GE(log.passes.size(), 2u);
            EXPECT_EQ(log.passes[0], Pass(0, 13)) << "both prompts whole in the first forward";
            EXPECT_EQ(log.passes[1], Pass(2, 0));
        }
    }
}

// A short prompt admitted behind a long one is not held for the long one's pieces: it goes in beside the
// first of them.
TEST(Scheduler, ShortPromptPassesALongOnesPieces) {
    auto be = make_backend({Device::CPU, 2, 0});
    auto m = random_model(*be, tiny());
    serve::SchedulerOptions so;
    so.slots = 2;
    so.prefill_chunk = 4;
    StepLog log;
    serve::Scheduler sched(*m, so, &log);
    SampleOptions one;
    one.temperature = 0.0f;
    one.max_new_tokens = 1;
    auto a = sched.submit({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2}, one);  // admitted first
    auto b = sched.submit({5, 6}, one);
    ASSERT_TRUE(a && b);
    run_until_ended(sched, {a, b});
    EXPECT_EQ(b->wait(0, std::chrono::seconds(1)).finish, serve::Finish::Length);
    const serve::Sequence::Update ua = a->wait(0, std::chrono::seconds(1));
    EXPECT_EQ(ua.finish, serve::Finish::Length) << ua.error;
    using Pass = std::pair<int, int>;
    EXPECT_EQ(log.passes, (std::vector<Pass>{{0, 6}, {0, 4}, {0, 4}}))
        << "b's 2 positions with a's first piece of 4, then a's other two pieces";
    EXPECT_EQ(log.events, (std::vector<int>{0, 0})) << "b's first token, then a's";
}

// Four requests with the same 10-token system prompt admitted together: the oldest prefills it, and the
// others take its pages as they are filled instead of computing them again, then prefill only their own ends;
// the answers are the generator's.
TEST(Scheduler, RequestsAdmittedTogetherFillASharedPrefixOnce) {
    auto be = make_backend({Device::CPU, 2, 0});
    auto m = random_model(*be, tiny_llama());
    const std::vector<int32_t> system = {4, 8, 1, 9, 3, 3, 7, 2, 6, 5};
    SampleOptions greedy;
    greedy.temperature = 0.0f;
    greedy.max_new_tokens = 3;
    std::vector<std::vector<int32_t>> prompts, want;
    Generator gen(*m, 2);
    for (int32_t end = 0; end < 4; end++) {
        prompts.push_back(system);
        prompts.back().insert(prompts.back().end(), {end, int32_t(10 - end)});
        want.push_back(gen.generate(prompts.back(), greedy));
    }
    for (const bool on : {true, false}) {
        serve::SchedulerOptions so;
        so.slots = 4;
        so.kv_page = 2;
        so.prefill_chunk = 2;
        so.prefix_caching = on;
        StepLog log;
        serve::Scheduler sched(*m, so, &log);
        std::vector<std::shared_ptr<serve::Sequence>> seqs;
        for (const auto& p : prompts) seqs.push_back(sched.submit(p, greedy));  // all wait: one admission
        run_until_ended(sched, seqs);
        for (size_t i = 0; i < seqs.size(); i++) {
            const serve::Sequence::Update u = seqs[i]->wait(0, std::chrono::seconds(1));
            EXPECT_EQ(u.tokens, want[i]) << "request " << i << ", prefix caching " << on;
        }
        int prompt_rows = 0;
        for (const auto& pass : log.passes) prompt_rows += pass.second;
        if (on) {  // the first prompt whole; the others' own last page: 5 of their 6 pages taken
            EXPECT_EQ(log.cached, 3 * 10);
            EXPECT_EQ(prompt_rows, 12 + 3 * 2);
        } else {
            EXPECT_EQ(log.cached, 0);
            EXPECT_EQ(prompt_rows, 4 * 12);
        }
    }
}

// A full queue refuses; a cancelled request leaves and its slot serves the next one.
TEST(Scheduler, QueueBoundAndCancel) {
    auto be = make_backend({Device::CPU, 2, 0});
    auto m = random_model(*be, tiny());
    serve::SchedulerOptions so;
    so.slots = 1;
    so.max_queue = 1;
    serve::Scheduler sched(*m, so);
    SampleOptions long_one;
    long_one.max_new_tokens = 15;
    auto a = sched.submit({1, 2}, long_one);
    auto b = sched.submit({3}, long_one);
    EXPECT_TRUE(a && b);
    EXPECT_FALSE(sched.submit({4}, long_one)) << "one slot and a queue of one: the third waits nowhere";
    a->cancel();
    b->cancel();
    std::thread client([&] {
        EXPECT_EQ(a->wait(0, std::chrono::seconds(10)).finish, serve::Finish::Cancelled);
        EXPECT_EQ(b->wait(0, std::chrono::seconds(10)).finish, serve::Finish::Cancelled);
        SampleOptions two;
        two.max_new_tokens = 2;
        auto c = sched.submit({5}, two);
        EXPECT_TRUE(c);
        serve::Sequence::Update u;
        size_t seen = 0;
        while (c && (u = c->wait(seen, std::chrono::seconds(10))).finish == serve::Finish::None)
            seen += u.tokens.size();
        EXPECT_EQ(u.finish, serve::Finish::Length);
        EXPECT_EQ(sched.load().running, 0);
        sched.stop();
    });
    sched.run();
    client.join();
}

// ---- the OpenAI side ------------------------------------------------------------------------------------

serve::ServedModel served(const Tokenizer& tok) {
    serve::ServedModel m;
    m.name = "tiny";
    m.n_ctx = 256;  // room for the alpaca template
    m.tok = &tok;
    m.stop_tokens = {tok.eot_id()};
    return m;
}

TEST(OpenAi, RequestFields) {
    ByteTokenizer tok;
    const serve::ServedModel m = served(tok);
    const serve::GenerationRequest r = serve::parse_request(
        serve::Endpoint::Completions,
        R"({"model":"tiny","prompt":"hey","max_tokens":5,"temperature":0.5,"top_p":0.9,"top_k":3,"seed":7,
            "stop":["x","yz"],"stream":true,"stream_options":{"include_usage":true}})",
        m, 1);
    EXPECT_EQ(r.prompts, std::vector<std::vector<int32_t>>{tok.encode("hey")});
    EXPECT_EQ(r.sample.max_new_tokens, 5);
    EXPECT_FLOAT_EQ(r.sample.temperature, 0.5f);
    EXPECT_FLOAT_EQ(r.sample.top_p, 0.9f);
    EXPECT_EQ(r.sample.top_k, 3);
    EXPECT_EQ(r.sample.seed, 7u);
    EXPECT_EQ(r.stop, (std::vector<std::string>{"x", "yz"}));
    EXPECT_TRUE(r.stream && r.include_usage);
    const serve::GenerationRequest d =
        serve::parse_request(serve::Endpoint::Completions, R"({"prompt":[1,2]})", m, 9);
    EXPECT_EQ(d.sample.max_new_tokens, 16) << "OpenAI's default for completions";
    EXPECT_EQ(d.sample.seed, 9u) << "no seed: the server's random one";
    EXPECT_EQ(d.prompts, (std::vector<std::vector<int32_t>>{{1, 2}}));
    const serve::GenerationRequest c = serve::parse_request(
        serve::Endpoint::Chat, R"({"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]})", m,
        1);
    EXPECT_EQ(c.sample.max_new_tokens, 256 - int(c.prompts[0].size())) << "chat: up to the context";
    const serve::GenerationRequest p = serve::parse_request(
        serve::Endpoint::Chat,
        R"({"messages":[{"role":"user","content":"hi"}],"presence_penalty":0.5,"frequency_penalty":-1,
            "logit_bias":{"65":-100,"10":2.5},"logprobs":false,"tool_choice":"none","user":"u1",
            "repetition_penalty":1.3,"min_p":0.05,
            "response_format":{"type":"text"}})",
        m, 1);
    EXPECT_FLOAT_EQ(p.sample.presence_penalty, 0.5f);
    EXPECT_FLOAT_EQ(p.sample.frequency_penalty, -1.0f);
    EXPECT_FLOAT_EQ(p.sample.repetition_penalty, 1.3f);
    EXPECT_FLOAT_EQ(p.sample.min_p, 0.05f);
    EXPECT_EQ(p.sample.logit_bias, (std::vector<std::pair<int32_t, float>>{{10, 2.5f}, {65, -100.0f}}))
        << "ids in the object's key order";
    EXPECT_EQ(p.logprobs.top, -1) << "logprobs false: none";
    // log-probabilities: completions' logprobs N (with echo, the prompt's too: max_tokens 0 scores it alone),
    // chat's logprobs and top_logprobs
    const serve::GenerationRequest e =
        serve::parse_request(serve::Endpoint::Completions,
                             R"({"prompt":[[5,6,7]],"echo":true,"logprobs":1,"max_tokens":0})", m, 1);
    EXPECT_EQ(e.prompts, (std::vector<std::vector<int32_t>>{{5, 6, 7}}))
        << "one prompt of token ids, in a list";
    // several prompts, a choice each: strings and token ids
    const serve::GenerationRequest several =
        serve::parse_request(serve::Endpoint::Completions, R"({"prompt":["ab",[7,8],"c"]})", m, 1);
    EXPECT_EQ(several.prompts,
              (std::vector<std::vector<int32_t>>{tok.encode("ab"), {7, 8}, tok.encode("c")}));
    EXPECT_TRUE(e.echo && e.logprobs.prompt);
    EXPECT_EQ(e.logprobs.top, 1);
    EXPECT_EQ(e.sample.max_new_tokens, 0);
    const serve::GenerationRequest e2 =
        serve::parse_request(serve::Endpoint::Completions, R"({"prompt":"a","echo":true})", m, 1);
    EXPECT_TRUE(e2.echo && !e2.logprobs.prompt && e2.logprobs.top == -1) << "echo alone: the text, no values";
    const serve::GenerationRequest h =
        serve::parse_request(serve::Endpoint::Chat,
                             R"({"messages":[{"role":"user","content":"hi"}],"logprobs":true,"top_logprobs":4,
            "return_tokens_as_token_ids":true})",
                             m, 1);
    EXPECT_EQ(h.logprobs.top, 4);
    EXPECT_FALSE(h.logprobs.prompt);
    EXPECT_TRUE(h.token_ids);
}

// The response objects' logprobs, as OpenAI's clients read them.
// OpenAI's n: each prompt n times, prompt-major, choice j seeded seed + j; usage counts each prompt once.
TEST(OpenAi, NChoicesPerPrompt) {
    ByteTokenizer tok;
    const serve::ServedModel m = served(tok);
    const serve::GenerationRequest r = serve::parse_request(
        serve::Endpoint::Completions, R"({"prompt":["ab","cde"],"n":3,"seed":40})", m, 1);
    ASSERT_EQ(r.prompts.size(), 6u);
    EXPECT_EQ(r.n, 3);
    for (size_t j = 0; j < 6; j++) {
        EXPECT_EQ(r.prompts[j], tok.encode(j < 3 ? "ab" : "cde")) << j;
        EXPECT_EQ(r.choice_sample(j).seed, 40u + j);
    }
    EXPECT_EQ(r.prompt_tokens(), 5);
    const serve::GenerationRequest one =
        serve::parse_request(serve::Endpoint::Chat, R"({"messages":[{"role":"user","content":"hi"}]})", m, 9);
    EXPECT_EQ(one.prompts.size(), 1u);
    EXPECT_EQ(one.choice_sample(0).seed, 9u) << "n = 1: the request's own seed, as before";
    const serve::GenerationRequest chat = serve::parse_request(
        serve::Endpoint::Chat, R"({"messages":[{"role":"user","content":"hi"}],"n":2})", m, 9);
    EXPECT_EQ(chat.prompts.size(), 2u);
    EXPECT_EQ(chat.prompt_tokens(), int(chat.prompts[0].size()));
}

TEST(OpenAi, LogprobObjects) {
    ByteTokenizer tok;
    TokenLogprob a{'h', -0.5f, {{'h', -0.5f}, {'x', -2.0f}}}, b{0xC3, -1.0f, {{'e', -0.25f}}};
    const std::vector<serve::LogprobItem> items = {{'>', nullptr}, {'h', &a}, {0xC3, &b}};
    size_t offset = 0;
    const nlohmann::json c = serve::completion_logprobs(tok, items, offset);
    ASSERT_EQ(c["tokens"].size(), 3u);
    EXPECT_EQ(c["tokens"][0], ">");
    EXPECT_EQ(c["tokens"][1], "h");
    EXPECT_EQ(c["tokens"][2], "\xC3") << "its own bytes (U+FFFD once written as JSON text)";
    EXPECT_TRUE(c["token_logprobs"][0].is_null() && c["top_logprobs"][0].is_null())
        << "nothing predicts the first";
    EXPECT_FLOAT_EQ(c["token_logprobs"][1].get<float>(), -0.5f);
    EXPECT_EQ(c["top_logprobs"][1], nlohmann::json::parse(R"({"h": -0.5, "x": -2.0})"));
    EXPECT_EQ(c["top_logprobs"][2].size(), 2u) << "the top one and the token itself";
    EXPECT_EQ(c["text_offset"], nlohmann::json::parse("[0, 1, 2]"));
    EXPECT_EQ(offset, 3u) << "half a character counts with its lead byte";
    size_t o2 = 10;
    const nlohmann::json ids = serve::completion_logprobs(tok, {{'h', &a}}, o2, true);
    EXPECT_EQ(ids["tokens"][0], "token_id:104");
    EXPECT_EQ(ids["top_logprobs"][0],
              nlohmann::json::parse(R"({"token_id:104": -0.5, "token_id:120": -2.0})"));
    EXPECT_EQ(ids["text_offset"][0], 10);
    const nlohmann::json h = serve::chat_logprobs(tok, items);
    ASSERT_EQ(h["content"].size(), 2u) << "the prompt's token is not the answer's";
    EXPECT_EQ(h["content"][0]["token"], "h");
    EXPECT_EQ(h["content"][0]["bytes"], nlohmann::json::parse("[104]"));
    EXPECT_EQ(h["content"][0]["top_logprobs"][1]["token"], "x");
    EXPECT_EQ(h["content"][1]["bytes"], nlohmann::json::parse("[195]")) << "the raw byte of half a character";
    EXPECT_TRUE(h["refusal"].is_null());
}

// token_logprob: the log-softmax of the logits, the likeliest first, ties by id.
TEST(Sampling, TokenLogprobIsTheLogSoftmax) {
    const std::vector<float> logits = {1.0f, 3.0f, 3.0f, -2.0f, 0.5f};
    double z = 0.0;
    for (const float x : logits) z += std::exp(double(x));
    const TokenLogprob t = token_logprob(logits, 4, 3);
    EXPECT_NEAR(t.logprob, 0.5 - std::log(z), 1e-6);
    ASSERT_EQ(t.top.size(), 3u);
    EXPECT_EQ(t.top[0].first, 1);
    EXPECT_EQ(t.top[1].first, 2);
    EXPECT_EQ(t.top[2].first, 0);
    EXPECT_NEAR(t.top[2].second, 1.0 - std::log(z), 1e-6);
    EXPECT_TRUE(token_logprob(logits, 0, 0).top.empty());
    EXPECT_EQ(token_logprob(logits, 0, 9).top.size(), logits.size());
    // far from 0: no overflow
    const TokenLogprob big = token_logprob(std::vector<float>{1000.0f, 999.0f}, 1, 0);
    EXPECT_NEAR(big.logprob, -1.0 - std::log1p(std::exp(-1.0)), 1e-5);
}

TEST(OpenAi, BadRequestsNameTheField) {
    ByteTokenizer tok;
    const serve::ServedModel m = served(tok);
    struct Bad {
        serve::Endpoint e;
        const char* body;
        int status;
        const char* param;
    };
    const serve::Endpoint C = serve::Endpoint::Completions, H = serve::Endpoint::Chat;
    const std::string long_prompt = "{\"prompt\":\"" + std::string(256, 'a') + "\"}";
    const std::vector<Bad> cases = {
        {C, "{\"prompt\":", 400, ""},
        {C, "[1,2]", 400, ""},
        {C, "{}", 400, "prompt"},
        {C, R"({"prompt":5})", 400, "prompt"},
        {C, R"({"prompt":[]})", 400, "prompt"},
        {C, R"({"prompt":[999]})", 400, "prompt"},
        {C, R"({"prompt":"a","max_tokens":"ten"})", 400, "max_tokens"},
        {C, R"({"prompt":"a","max_tokens":0})", 400, "max_tokens"},
        {C, R"({"prompt":"a","max_tokens":256})", 400, "max_tokens"},
        {C, long_prompt.c_str(), 400, "prompt"},
        {C, R"({"prompt":"a","temperature":3})", 400, "temperature"},
        {C, R"({"prompt":"a","top_p":0})", 400, "top_p"},
        {C, R"({"prompt":"a","n":0})", 400, "n"},
        {C, R"({"prompt":"a","n":"two"})", 400, "n"},
        {C, R"({"prompt":["a","b"],"n":33})", 400, "n"},
        {C, R"({"prompt":"a","stop":[1]})", 400, "stop"},
        {C, R"({"prompt":"a","stream":"yes"})", 400, "stream"},
        {C, R"({"prompt":"a","model":"gpt-4"})", 404, "model"},
        {C, R"({"prompt":"a","presence_penalty":3})", 400, "presence_penalty"},
        {C, R"({"prompt":"a","frequency_penalty":"high"})", 400, "frequency_penalty"},
        {C, R"({"prompt":"a","logit_bias":{"300":1}})", 400, "logit_bias"},
        {C, R"({"prompt":"a","logit_bias":{"x":1}})", 400, "logit_bias"},
        {C, R"({"prompt":"a","logit_bias":{"65":101}})", 400, "logit_bias"},
        {C, R"({"prompt":"a","repetition_penalty":0})", 400, "repetition_penalty"},
        {C, R"({"prompt":"a","min_p":1.5})", 400, "min_p"},
        {C, R"({"prompt":"a","logprobs":21})", 400, "logprobs"},
        {C, R"({"prompt":"a","logprobs":true})", 400, "logprobs"},
        {C, R"({"prompt":"a","echo":"yes"})", 400, "echo"},
        {C, R"({"prompt":"a","top_logprobs":2})", 400, "top_logprobs"},
        {C, R"({"prompt":[[1,2],[]]})", 400, "prompt"},
        {C, R"({"prompt":["a",5]})", 400, "prompt"},
        {C, R"({"prompt":[[1,2],[999]]})", 400, "prompt"},
        {C, R"({"prompt":"a","best_of":3})", 400, "best_of"},
        {C, R"({"prompt":"a","suffix":"z"})", 400, "suffix"},
        {H, R"({"messages":[{"role":"user","content":"a"}],"logprobs":3})", 400, "logprobs"},
        {H, R"({"messages":[{"role":"user","content":"a"}],"top_logprobs":3})", 400, "top_logprobs"},
        {H, R"({"messages":[{"role":"user","content":"a"}],"logprobs":true,"top_logprobs":21})", 400,
         "top_logprobs"},
        {H, R"({"messages":[{"role":"user","content":"a"}],"echo":true})", 400, "echo"},
        {H, R"({"messages":[{"role":"user","content":"a"}],"tools":[{"type":"function"}]})", 400, "tools"},
        {H, R"({"messages":[{"role":"user","content":"a"}],"tool_choice":"required"})", 400, "tool_choice"},
        {H, R"({"messages":[{"role":"user","content":"a"}],"response_format":{"type":"json_object"}})", 400,
         "response_format"},
        {H, R"({"prompt":"a"})", 400, "messages"},
        {H, R"({"messages":[{"role":"wizard","content":"a"}]})", 400, "messages[0].role"},
        {H, R"({"messages":[{"role":"user"}]})", 400, "messages[0].content"},
        {H, R"({"messages":[{"role":"user","content":"a"},{"role":"system","content":"b"}]})", 400,
         "messages[1]"},
        {H, R"({"messages":[{"role":"system","content":"a"}]})", 400, "messages"},
    };
    for (const Bad& b : cases) {
        try {
            serve::parse_request(b.e, b.body, m, 1);
            ADD_FAILURE() << "accepted: " << b.body;
        } catch (const serve::ApiError& e) {
            EXPECT_EQ(e.status, b.status) << b.body << ": " << e.what();
            EXPECT_EQ(e.param, b.param) << b.body << ": " << e.what();
            const nlohmann::json j = serve::error_body(e);
            EXPECT_TRUE(j["error"]["message"].is_string() && j["error"]["type"].is_string()) << j.dump();
        }
    }
    // more prompts than the server's sequences and queue take
    serve::ServedModel two = m;
    two.max_prompts = 2;
    try {
        serve::parse_request(C, R"({"prompt":["a","b","c"]})", two, 1);
        ADD_FAILURE() << "three prompts accepted where two fit";
    } catch (const serve::ApiError& e) {
        EXPECT_EQ(e.param, "prompt");
        EXPECT_NE(std::string(e.what()).find("at most 2"), std::string::npos) << e.what();
    }
    // a conversation the model's template cannot render: Llama 2 Chat's turns alternate
    serve::ServedModel llama2 = m;
    llama2.prompt = PromptTemplate::Llama2;
    try {
        serve::parse_request(
            H, R"({"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}]})", llama2, 1);
        ADD_FAILURE() << "two user turns in a row accepted for llama2";
    } catch (const serve::ApiError& e) {
        EXPECT_EQ(e.status, 400);
        EXPECT_EQ(e.param, "messages");
        EXPECT_NE(std::string(e.what()).find("message 2: the llama2 template needs"), std::string::npos)
            << e.what();
    }
}

// The byte tokenizer makes each byte a token: stop strings and UTF-8 characters arrive split.
TEST(TextStream, HoldsBackStopPrefixesAndHalfCharacters) {
    ByteTokenizer tok;
    TextStream s(tok, {"END"});
    std::string shown;
    for (char ch : std::string("abcEN")) shown += s.push({int32_t(uint8_t(ch))});
    EXPECT_EQ(shown, "abc") << "\"EN\" may become the stop string";
    shown += s.push({int32_t('x')});
    EXPECT_EQ(shown, "abcENx") << "it did not";
    for (char ch : std::string("yEND tail")) shown += s.push({int32_t(uint8_t(ch))});
    EXPECT_TRUE(s.stopped());
    EXPECT_EQ(shown, "abcENxy");
    EXPECT_EQ(s.finish(), "");

    TextStream u(tok, {});
    const std::string euro = "\xE2\x82\xAC";  // U+20AC in three bytes
    EXPECT_EQ(u.push({0xE2}), "");
    EXPECT_EQ(u.push({0x82}), "");
    EXPECT_EQ(u.push({0xAC}), euro);
    EXPECT_EQ(u.push({0xE2}), "");
    EXPECT_EQ(u.finish(), "\xE2") << "at the end the rest comes out as it is";
    EXPECT_EQ(u.tokens(), 4);
}

// API keys: only "Bearer KEY" with a whole key lets in; keys come from the flags, a file and the
// environment; bad ones are errors naming where they came from.
TEST(ApiKeys, AdmitOnlyAWholeKey) {
    const serve::ApiKeys none;
    EXPECT_FALSE(none.on());
    const serve::ApiKeys keys({"sk-alpha", "sk-b"});
    EXPECT_TRUE(keys.admits("Bearer sk-alpha"));
    EXPECT_TRUE(keys.admits("Bearer sk-b"));
    for (const char* bad : {"", "Bearer ", "Bearer sk-alph", "Bearer sk-alphaa", "Bearer sk-a", "sk-alpha",
                            "bearer sk-alpha", "Bearer  sk-alpha", "Basic sk-alpha", "Bearer sk-b\n"})
        EXPECT_FALSE(keys.admits(bad)) << bad;
}

TEST(ApiKeys, LoadFromFlagsFileAndEnvironment) {
    const std::string dir = fresh_dir("api_keys"), file = dir + "/keys";
    write_file_atomic(file, "# keys\n\n  sk-file  \r\nsk-file2\n");
    const serve::ApiKeys k = serve::load_api_keys({"sk-flag"}, file, " sk-env1 ,sk-env2");
    EXPECT_EQ(k.size(), 5u);
    for (const char* key : {"sk-flag", "sk-file", "sk-file2", "sk-env1", "sk-env2"})
        EXPECT_TRUE(k.admits(std::string("Bearer ") + key)) << key;
    EXPECT_FALSE(serve::load_api_keys({}, "", nullptr).on());
    expect_error([] { serve::load_api_keys({""}, "", nullptr); }, "--api-key: an empty API key");
    expect_error([] { serve::load_api_keys({"a b"}, "", nullptr); }, "one printable word");
    expect_error([&] { serve::load_api_keys({}, dir + "/none", nullptr); }, "no such file");
    write_file_atomic(file, "# only a comment\n");
    expect_error([&] { serve::load_api_keys({}, file, nullptr); }, "holds no key");
    write_file_atomic(file, "sk-ok\nsk bad\n");
    expect_error([&] { serve::load_api_keys({}, file, nullptr); }, "line 2");
    expect_error([] { serve::load_api_keys({}, "", ","); }, "ANVIL_API_KEY");
    std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace anvil::test
