#include "serve/server.h"

#include <fmt/format.h>

#include <random>

#include "core/error.h"
#include "data/text_stream.h"
#include "io/json_text.h"

namespace anvil::serve {

namespace {

constexpr auto kPoll = std::chrono::milliseconds(100);  // how often a waiting handler looks at its client

const char* kJson = "application/json";

void send_json(HttpExchange& ex, int status, const nlohmann::json& j, const HttpHeaders& extra = {}) {
    ex.reply(status, kJson, json_text(j), extra);
}

void send_error(HttpExchange& ex, const ApiError& e, const HttpHeaders& extra = {}) {
    send_json(ex, e.status, error_body(e), extra);
}

std::string sse(const nlohmann::json& j) {
    return "data: " + json_text(j) + "\n\n";
}

// The endpoint label of a path in /metrics (unknown paths in one label, so clients cannot grow the series).
std::string endpoint_label(const std::string& path) {
    for (const char* p : {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"})
        if (path == p) return p;
    return "other";
}

ApiError shutting_down() {
    return ApiError(503, "the server is shutting down; retry on another replica", "", "server_error");
}

// A sequence that ended without its text: the server stopped it (503) or the model failed (500).
ApiError ended_error(Finish f, const std::string& error) {
    if (f == Finish::Error) return ApiError(500, "generation failed: " + error, "", "server_error");
    return shutting_down();
}

// A handler's side of its sequence: waits for tokens and turns them into text that may be shown, ending the
// sequence at a stop string (its slot is free for others at once).
struct Follower {
    Follower(std::shared_ptr<Sequence> s, const Tokenizer& tok, std::vector<std::string> stop)
        : seq(std::move(s)), text(tok, std::move(stop)) {}
    std::shared_ptr<Sequence> seq;
    size_t offset = 0;  // completions' text offset of the next token (logprobs)
    TextStream text;
    size_t seen = 0;
    Finish finish = Finish::None;        // != None: the generation is over
    std::string error;                   // with Finish::Error
    std::vector<TokenLogprob> logprobs;  // the tokens' so far (text.ids()), when asked for
    size_t fresh = 0;                    // tokens [fresh..] came with the last next()

    // Waits up to `wait`; returns the text that may be shown since the last call (the rest once it is over).
    std::string next(std::chrono::milliseconds wait = kPoll) {
        Sequence::Update u = seq->wait(seen, wait);
        seen += u.tokens.size();
        fresh = size_t(text.tokens());
        for (TokenLogprob& lp : u.logprobs) logprobs.push_back(std::move(lp));
        std::string delta = text.push(u.tokens);
        if (text.stopped()) {
            seq->cancel();
            finish = Finish::Stop;
        } else if (u.finish != Finish::None) {
            finish = u.finish;
            error = u.error;
            if (finish == Finish::Stop || finish == Finish::Length) delta += text.finish();
        }
        return delta;
    }
    bool ended_badly() const { return finish == Finish::Cancelled || finish == Finish::Error; }
    // tokens [from..] with their log-probabilities
    std::vector<LogprobItem> items(size_t from) const {
        std::vector<LogprobItem> out;
        for (size_t k = from; k < logprobs.size() && k < text.ids().size(); k++)
            out.push_back({text.ids()[k], &logprobs[k]});
        return out;
    }
};

}  // namespace

struct Server::Impl {
    Scheduler& sched;
    Metrics& metrics;
    const ServedModel& model;
    ServerOptions opt;
    HttpServer http;
    std::atomic<bool> draining{false};
    std::atomic<uint64_t> next_id{0};
    std::mutex seed_m;
    std::mt19937_64 seeds{std::random_device{}()};

    Impl(Scheduler& s, Metrics& m, const ServedModel& md, const ServerOptions& o)
        : sched(s), metrics(m), model(md), opt(o),
          http(o.limits, [this](const HttpRequest& q, HttpExchange& ex) { route(q, ex); },
               [](int status, const std::string& why) { return json_text(error_body(ApiError(status, why))); },
               [this](const std::string& path, int status) { metrics.on_request(endpoint_label(path), status); }) {}

    uint64_t random_seed() {
        std::lock_guard<std::mutex> lk(seed_m);
        return seeds();
    }
    // Every request: its key, then its endpoint.
    void route(const HttpRequest& q, HttpExchange& ex);
    void generate(Endpoint endpoint, const HttpRequest& q, HttpExchange& ex);
    std::vector<Follower> follow(const GenerationRequest& r, std::vector<std::shared_ptr<Sequence>> seqs);
    void reply_whole(const GenerationRequest& r, const ResponseHead& h, std::vector<Follower> fs,
                     HttpExchange& ex);
    void reply_stream(const GenerationRequest& r, const ResponseHead& h, std::vector<Follower> fs,
                      HttpExchange& ex);
    // A stream's choices and how far each has got.
    struct StreamState {
        std::vector<Follower> fs;
        std::vector<bool> first;  // per choice: nothing of it sent yet
        bool done = false;
    };
    // Choice i's next events (its role, text, values, end) after waiting up to `wait`; `failed` when it ended
    // badly, which ends the other choices too.
    std::string stream_step(const GenerationRequest& r, const ResponseHead& h, StreamState& st, size_t i,
                            std::chrono::milliseconds wait, bool& failed);
    // The logprobs of follower i's tokens from `from` on (with echo and `from` 0, its prompt's first).
    nlohmann::json logprobs(const GenerationRequest& r, Follower& f, size_t i, size_t from, bool echo);
};

void Server::Impl::generate(Endpoint endpoint, const HttpRequest& q, HttpExchange& ex) {
    try {
        if (draining) throw shutting_down();
        const GenerationRequest r = parse_request(endpoint, q.body, model, random_seed());
        // a sequence per prompt, all or none (a full queue refuses the request whole)
        std::vector<std::shared_ptr<Sequence>> seqs;
        for (size_t i = 0; i < r.prompts.size(); i++) {
            seqs.push_back(sched.submit(r.prompts[i], r.choice_sample(i), r.logprobs));
            if (seqs.back()) continue;
            for (auto& s : seqs)
                if (s) s->cancel();
            const Scheduler::Load l = sched.load();
            throw ApiError(
                429,
                fmt::format("the server is busy: {} sequences running and {} waiting (the queue is full); "
                            "retry later",
                            l.running, l.queued),
                "", "rate_limit_exceeded", "rate_limit_exceeded");
        }
        const ResponseHead h{
            endpoint, fmt::format("{}-{:x}", endpoint == Endpoint::Chat ? "chatcmpl" : "cmpl", next_id++),
            model.name, int64_t(std::time(nullptr))};
        if (r.stream)
            reply_stream(r, h, follow(r, std::move(seqs)), ex);
        else
            reply_whole(r, h, follow(r, std::move(seqs)), ex);
    } catch (const ApiError& e) {
        send_error(ex, e);
    }
}

std::vector<Follower> Server::Impl::follow(const GenerationRequest& r,
                                           std::vector<std::shared_ptr<Sequence>> seqs) {
    std::vector<Follower> fs;
    for (size_t i = 0; i < seqs.size(); i++) {
        fs.emplace_back(std::move(seqs[i]), *model.tok, r.stop);
        // completions count text offsets in the prompt and the completion together
        if (r.logprobs.top >= 0 && r.endpoint == Endpoint::Completions && !r.echo)
            fs.back().offset = utf8_length(model.tok->decode(r.prompts[i]));
    }
    return fs;
}

nlohmann::json Server::Impl::logprobs(const GenerationRequest& r, Follower& f, size_t i, size_t from,
                                      bool echo) {
    if (r.logprobs.top < 0) return nullptr;
    if (r.endpoint == Endpoint::Chat) return chat_logprobs(*model.tok, f.items(from), r.token_ids);
    std::vector<LogprobItem> items;
    std::vector<TokenLogprob> prompt_lp;
    if (echo) {  // the prompt's tokens first, the first of them unpredicted
        const std::vector<int32_t>& prompt = r.prompts[i];
        prompt_lp = f.seq->prompt_logprobs();
        for (size_t k = 0; k < prompt.size(); k++)
            items.push_back({prompt[k], k == 0 || k > prompt_lp.size() ? nullptr : &prompt_lp[k - 1]});
    }
    for (const LogprobItem& it : f.items(from)) items.push_back(it);
    return completion_logprobs(*model.tok, items, f.offset, r.token_ids);
}

void Server::Impl::reply_whole(const GenerationRequest& r, const ResponseHead& h, std::vector<Follower> fs,
                               HttpExchange& ex) {
    for (Follower& f : fs)
        while (f.finish == Finish::None) {
            f.next();
            // the client left: its sequences end and free their slots
            if (f.finish == Finish::None && ex.client_gone()) {
                for (size_t i = 0; i < fs.size(); i++) {
                    fs[i].seq->cancel();
                    metrics.on_generation("abandoned", int(r.prompts[i].size()), fs[i].text.tokens());
                }
                // nobody reads it; nginx's "client closed request", for the request counters
                ex.abandon(499);
                return;
            }
        }
    std::vector<Choice> choices;
    int completion_tokens = 0;
    for (size_t i = 0; i < fs.size(); i++) {
        Follower& f = fs[i];
        const int P = int(r.prompts[i].size());
        metrics.on_generation(finish_name(f.finish), P, f.text.tokens());
        if (f.ended_badly()) {
            for (Follower& other : fs) other.seq->cancel();
            throw ended_error(f.finish, f.error);
        }
        // echo: the prompt's text before the completion's (and its tokens before the completion's)
        const std::string echoed = r.echo ? model.tok->decode(r.prompts[i]) : "";
        choices.push_back({echoed + f.text.text(), finish_name(f.finish), logprobs(r, f, i, 0, r.echo)});
        completion_tokens += f.text.tokens();
    }
    send_json(ex, 200, completion_response(h, choices, r.prompt_tokens(), completion_tokens));
}

std::string Server::Impl::stream_step(const GenerationRequest& r, const ResponseHead& h, StreamState& st,
                                      size_t i, std::chrono::milliseconds wait, bool& failed) {
    std::string out;
    Follower& f = st.fs[i];
    const int index = int(i);
    if (st.first[i] && h.endpoint == Endpoint::Chat) {  // the role first, as OpenAI sends it
        out += sse(stream_chunk(h, "", nullptr, true));
        st.first[i] = false;
    }
    std::string delta = f.next(wait);
    const bool fresh = f.logprobs.size() > f.fresh;
    // echo: the prompt (its text, its tokens' values) leads the choice's first chunk, sent once the prompt is
    // scored (the first token, or the end when max_tokens is 0)
    const bool echo = r.echo && st.first[i] && (!delta.empty() || fresh || f.finish != Finish::None);
    if (echo) delta = model.tok->decode(r.prompts[i]) + delta;
    // the values of the tokens that came with this delta (their text may be held back)
    const nlohmann::json lp = fresh || echo ? logprobs(r, f, i, f.fresh, echo) : nlohmann::json();
    if (!delta.empty() || !lp.is_null()) {
        out += sse(stream_chunk(h, delta, nullptr, st.first[i], lp, index));
        st.first[i] = false;
    }
    if (f.finish == Finish::None) return out;
    metrics.on_generation(finish_name(f.finish), int(r.prompts[i].size()), f.text.tokens());
    if (!f.ended_badly())
        return out + sse(stream_chunk(h, "", finish_name(f.finish), st.first[i], nullptr, index));
    out += sse(error_body(ended_error(f.finish, f.error)));
    failed = true;
    for (size_t k = 0; k < st.fs.size(); k++)
        if (st.fs[k].finish == Finish::None) {
            st.fs[k].seq->cancel();
            st.fs[k].finish = Finish::Cancelled;
            metrics.on_generation("cancelled", int(r.prompts[k].size()), st.fs[k].text.tokens());
        }
    return out;
}

void Server::Impl::reply_stream(const GenerationRequest& r, const ResponseHead& h, std::vector<Follower> fs,
                                HttpExchange& ex) {
    // One choice that fails (the model's error, a drain) ends the stream with its error; the others stop.
    StreamState st{std::move(fs), {}, false};
    st.first.assign(st.fs.size(), true);
    bool gone = !ex.open_stream(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
    while (!st.done && !gone) {
        std::string out;
        bool failed = false;
        size_t open = 0;
        for (const Follower& f : st.fs) open += f.finish == Finish::None;
        // each open choice in turn, the wait shared among them
        const auto wait = std::max(kPoll / int(std::max<size_t>(open, 1)), std::chrono::milliseconds(5));
        for (size_t i = 0; i < st.fs.size() && !failed; i++)
            if (st.fs[i].finish == Finish::None) out += stream_step(r, h, st, i, wait, failed);
        bool all = true;
        int completion_tokens = 0;
        for (size_t i = 0; i < st.fs.size(); i++) {
            all = all && st.fs[i].finish != Finish::None;
            completion_tokens += st.fs[i].text.tokens();
        }
        if (all || failed) {
            if (r.include_usage) out += sse(usage_chunk(h, r.prompt_tokens(), completion_tokens));
            out += "data: [DONE]\n\n";
            st.done = true;
        }
        gone = !ex.write_chunk(out) || (!st.done && ex.client_gone());
    }
    if (!gone) {
        ex.close_stream();
        return;
    }
    // the client left: its sequences end and free their slots
    for (size_t i = 0; i < st.fs.size(); i++) {
        Follower& f = st.fs[i];
        f.seq->cancel();
        if (f.finish == Finish::None) metrics.on_generation("abandoned", int(r.prompts[i].size()), f.text.tokens());
    }
    ex.abandon(499);
}

void Server::Impl::route(const HttpRequest& q, HttpExchange& ex) {
    // API keys: checked before routing, so an unknown path says 401 too and tells nothing of the routes
    if (opt.keys.on() && q.path != "/health" && !(q.path == "/metrics" && opt.public_metrics)) {
        const std::string* auth = q.header("Authorization");
        if (!opt.keys.admits(auth ? *auth : "")) {
            send_error(ex,
                       ApiError(401,
                                auth == nullptr ? "no API key: send it as `Authorization: Bearer KEY`"
                                                : "incorrect API key in the Authorization header (`Bearer KEY`)",
                                "", "invalid_request_error", "invalid_api_key"),
                       {{"WWW-Authenticate", "Bearer"}});
            return;
        }
    }
    const bool get = q.method == "GET", post = q.method == "POST";
    try {
        if (q.path == "/v1/completions" && post)
            generate(Endpoint::Completions, q, ex);
        else if (q.path == "/v1/chat/completions" && post)
            generate(Endpoint::Chat, q, ex);
        else if (q.path == "/v1/models" && get)
            send_json(ex, 200, models_list(model));
        else if (q.path == "/health" && get)
            send_json(ex, draining ? 503 : 200, {{"status", draining ? "draining" : "ok"}});
        else if (q.path == "/metrics" && get)
            ex.reply(200, "text/plain; version=0.0.4",
                     metrics.text(sched.load(), double(sched.cache_bytes()), http.open_connections()));
        else if (endpoint_label(q.path) != "other")
            send_error(ex, ApiError(405, fmt::format("{} does not take {}", q.path, q.method)));
        else
            send_error(ex, ApiError(404, fmt::format("no such endpoint: {} {}", q.method, q.path)));
    } catch (const std::exception& e) {
        send_error(ex, ApiError(500, e.what(), "", "server_error"));
    }
}

Server::Server(Scheduler& sched, Metrics& metrics, const ServedModel& model, const ServerOptions& o)
    : impl_(std::make_unique<Impl>(sched, metrics, model, o)) {}

Server::~Server() {
    stop();
}

int Server::bind() {
    return impl_->http.bind(impl_->opt.host, impl_->opt.port);
}

void Server::start() {
    impl_->http.start();
}

void Server::refuse_new() {
    impl_->draining = true;
}

void Server::stop() {
    impl_->http.stop();
}

}  // namespace anvil::serve
