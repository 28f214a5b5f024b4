#include "serve/server.h"

#include <fmt/format.h>
#include <httplib.h>

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>
#include <random>
#include <thread>

#include "core/error.h"
#include "data/text_stream.h"
#include "io/json_text.h"

namespace anvil::serve {

namespace {

constexpr auto kPoll = std::chrono::milliseconds(100);  // how often a waiting handler looks at its client

const char* kJson = "application/json";

void send_json(httplib::Response& res, int status, const nlohmann::json& j) {
    res.status = status;
    res.set_content(json_text(j), kJson);
}

void send_error(httplib::Response& res, const ApiError& e) {
    send_json(res, e.status, error_body(e));
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

// The numeric host and port of a socket's own end (peer = false) or its peer's, as the HTTP library writes
// them.
bool socket_end(int fd, bool peer, std::string& host, int& port) {
    sockaddr_storage a{};
    socklen_t n = sizeof a;
    if ((peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &n)
              : ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n)) != 0)
        return false;
    char h[NI_MAXHOST], p[NI_MAXSERV];
    if (::getnameinfo(reinterpret_cast<sockaddr*>(&a), n, h, sizeof h, p, sizeof p,
                      NI_NUMERICHOST | NI_NUMERICSERV) != 0)
        return false;
    host = h;
    port = std::atoi(p);
    return true;
}

// Whether the client of a request that waits for its whole answer has gone. Debian's cpp-httplib (0.11) tells
// a handler nothing of its connection (later versions have Request::is_connection_closed), so the connection
// is found among this process's sockets by its two ends, which identify it while the handler runs (the
// library closes it only afterwards), and polled for the peer's hang-up. Not found: never gone, the answer
// runs to its end as before.
class ClientWatch {
public:
    explicit ClientWatch(const httplib::Request& q) {
        DIR* d = ::opendir("/proc/self/fd");
        if (!d) return;
        while (const dirent* e = ::readdir(d)) {
            char* end = nullptr;
            const long fd = std::strtol(e->d_name, &end, 10);
            struct stat st {};
            if (*end != '\0' || end == e->d_name || ::fstat(int(fd), &st) != 0 || !S_ISSOCK(st.st_mode))
                continue;
            std::string host;
            int port = -1;
            if (socket_end(int(fd), true, host, port) && port == q.remote_port && host == q.remote_addr &&
                socket_end(int(fd), false, host, port) && port == q.local_port && host == q.local_addr) {
                fd_ = int(fd);
                break;
            }
        }
        ::closedir(d);
    }
    bool gone() const {
        if (fd_ < 0) return false;
        pollfd p{fd_, POLLRDHUP, 0};
        return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
    }

private:
    int fd_ = -1;
};

}  // namespace

struct Server::Impl {
    Scheduler& sched;
    Metrics& metrics;
    const ServedModel& model;
    ServerOptions opt;
    httplib::Server http;
    std::thread thread;
    std::atomic<bool> draining{false};
    std::atomic<uint64_t> next_id{0};
    std::mutex seed_m;
    std::mt19937_64 seeds{std::random_device{}()};

    Impl(Scheduler& s, Metrics& m, const ServedModel& md, const ServerOptions& o)
        : sched(s), metrics(m), model(md), opt(o) {}

    uint64_t random_seed() {
        std::lock_guard<std::mutex> lk(seed_m);
        return seeds();
    }
    void generate(Endpoint endpoint, const httplib::Request& req, httplib::Response& res);
    std::vector<Follower> follow(const GenerationRequest& r, std::vector<std::shared_ptr<Sequence>> seqs);
    void reply_whole(const GenerationRequest& r, const ResponseHead& h, std::vector<Follower> fs,
                     const httplib::Request& req, httplib::Response& res);
    void reply_stream(const GenerationRequest& r, const ResponseHead& h, std::vector<Follower> fs,
                      httplib::Response& res);
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

void Server::Impl::generate(Endpoint endpoint, const httplib::Request& req, httplib::Response& res) {
    try {
        if (draining) throw shutting_down();
        const GenerationRequest r = parse_request(endpoint, req.body, model, random_seed());
        // a sequence per prompt, all or none (a full queue refuses the request whole)
        std::vector<std::shared_ptr<Sequence>> seqs;
        for (const auto& prompt : r.prompts) {
            seqs.push_back(sched.submit(prompt, r.sample, r.logprobs));
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
            reply_stream(r, h, follow(r, std::move(seqs)), res);
        else
            reply_whole(r, h, follow(r, std::move(seqs)), req, res);
    } catch (const ApiError& e) {
        send_error(res, e);
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
                               const httplib::Request& req, httplib::Response& res) {
    const ClientWatch client(req);
    for (Follower& f : fs)
        while (f.finish == Finish::None) {
            f.next();
            // the client left: its sequences end and free their slots
            if (f.finish == Finish::None && client.gone()) {
                for (size_t i = 0; i < fs.size(); i++) {
                    fs[i].seq->cancel();
                    metrics.on_generation("abandoned", int(r.prompts[i].size()), fs[i].text.tokens());
                }
                // nobody reads it; nginx's "client closed request", for the request counters
                res.status = 499;
                return;
            }
        }
    std::vector<Choice> choices;
    int prompt_tokens = 0, completion_tokens = 0;
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
        prompt_tokens += P;
        completion_tokens += f.text.tokens();
    }
    send_json(res, 200, completion_response(h, choices, prompt_tokens, completion_tokens));
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
                                httplib::Response& res) {
    auto st = std::make_shared<StreamState>(StreamState{std::move(fs), {}, false});
    // One choice that fails (the model's error, a drain) ends the stream with its error; the others stop.
    st->first.assign(st->fs.size(), true);
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, st, h, r](size_t, httplib::DataSink& sink) {
            std::string out;
            bool failed = false;
            size_t open = 0;
            for (const Follower& f : st->fs) open += f.finish == Finish::None;
            // each open choice in turn, the wait shared among them
            const auto wait = std::max(kPoll / int(std::max<size_t>(open, 1)), std::chrono::milliseconds(5));
            for (size_t i = 0; i < st->fs.size() && !failed; i++)
                if (st->fs[i].finish == Finish::None) out += stream_step(r, h, *st, i, wait, failed);
            bool all = true;
            int prompt_tokens = 0, completion_tokens = 0;
            for (size_t i = 0; i < st->fs.size(); i++) {
                all = all && st->fs[i].finish != Finish::None;
                prompt_tokens += int(r.prompts[i].size());
                completion_tokens += st->fs[i].text.tokens();
            }
            if (all || failed) {
                if (r.include_usage) out += sse(usage_chunk(h, prompt_tokens, completion_tokens));
                out += "data: [DONE]\n\n";
                st->done = true;
            }
            // a client that left: its sequences end and free their slots
            if (!out.empty() && !sink.write(out.data(), out.size())) return false;
            if (!sink.is_writable()) return false;
            if (st->done) sink.done();
            return true;
        },
        [this, st, r](bool success) {
            if (success && st->done) return;
            for (size_t i = 0; i < st->fs.size(); i++) {  // the client left before the end
                Follower& f = st->fs[i];
                f.seq->cancel();
                if (f.finish == Finish::None)
                    metrics.on_generation("abandoned", int(r.prompts[i].size()), f.text.tokens());
            }
        });
}

Server::Server(Scheduler& sched, Metrics& metrics, const ServedModel& model, const ServerOptions& o)
    : impl_(std::make_unique<Impl>(sched, metrics, model, o)) {
    routes();
}

Server::~Server() {
    stop();
}

void Server::routes() {
    Impl& s = *impl_;
    httplib::Server& http = s.http;
    // a handler per running and per queued request (each waits on its sequence), and some for the rest
    const SchedulerOptions& so = s.sched.options();
    const size_t threads = size_t(so.slots + so.max_queue + 16);
    http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    http.set_payload_max_length(size_t(s.opt.max_body_mb * 1024.0 * 1024.0));
    // API keys: checked before routing, so an unknown path says 401 too and tells nothing of the routes
    if (s.opt.keys.on())
        http.set_pre_routing_handler([&s](const httplib::Request& q, httplib::Response& r) {
            if (q.path == "/health" || (q.path == "/metrics" && s.opt.public_metrics) ||
                s.opt.keys.admits(q.get_header_value("Authorization")))
                return httplib::Server::HandlerResponse::Unhandled;
            const bool none = !q.has_header("Authorization");
            r.set_header("WWW-Authenticate", "Bearer");
            send_error(r, ApiError(401,
                                   none ? "no API key: send it as `Authorization: Bearer KEY`"
                                        : "incorrect API key in the Authorization header (`Bearer KEY`)",
                                   "", "invalid_request_error", "invalid_api_key"));
            return httplib::Server::HandlerResponse::Handled;
        });
    http.Post("/v1/completions", [&s](const httplib::Request& q, httplib::Response& r) {
        s.generate(Endpoint::Completions, q, r);
    });
    http.Post("/v1/chat/completions",
              [&s](const httplib::Request& q, httplib::Response& r) { s.generate(Endpoint::Chat, q, r); });
    http.Get("/v1/models", [&s](const httplib::Request&, httplib::Response& r) {
        send_json(r, 200, models_list(s.model));
    });
    http.Get("/health", [&s](const httplib::Request&, httplib::Response& r) {
        if (s.draining)
            send_json(r, 503, {{"status", "draining"}});
        else
            send_json(r, 200, {{"status", "ok"}});
    });
    http.Get("/metrics", [&s](const httplib::Request&, httplib::Response& r) {
        r.set_content(s.metrics.text(s.sched.load(), double(s.sched.cache_bytes())),
                      "text/plain; version=0.0.4");
    });
    // what the library answers itself (unknown path, body too large, bad HTTP): OpenAI's error body
    http.set_error_handler(
        httplib::Server::HandlerWithResponse([](const httplib::Request& q, httplib::Response& r) {
            if (!r.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
            std::string message = fmt::format("HTTP {}", r.status);
            if (r.status == 404) message = fmt::format("no such endpoint: {} {}", q.method, q.path);
            if (r.status == 405) message = fmt::format("{} does not take {}", q.path, q.method);
            if (r.status == 413) message = "the request body is larger than the server's --max-body-mb";
            send_json(r, r.status, error_body(ApiError(r.status, message)));
            return httplib::Server::HandlerResponse::Handled;
        }));
    http.set_exception_handler([](const httplib::Request&, httplib::Response& r, std::exception_ptr ep) {
        std::string what = "internal error";
        try {
            std::rethrow_exception(ep);
        } catch (const std::exception& e) {
            what = e.what();
        } catch (...) {
        }
        send_json(r, 500, error_body(ApiError(500, what, "", "server_error")));
    });
    http.set_logger([&s](const httplib::Request& q, const httplib::Response& r) {
        s.metrics.on_request(endpoint_label(q.path), r.status);
    });
}

int Server::bind() {
    Impl& s = *impl_;
    // The library listens with a backlog of 5 (compiled into Debian's build): past it, a burst of clients
    // waits on SYN retries. Keep the socket to listen again with the system's limit. SO_REUSEADDR only: the
    // library's default SO_REUSEPORT would let a second server share the port instead of saying it is taken.
    socket_t fd = INVALID_SOCKET;
    s.http.set_socket_options([&fd](socket_t sock) {
        int yes = 1;
        ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
        fd = sock;
    });
    int port = s.opt.port;
    if (port == 0)
        port = s.http.bind_to_any_port(s.opt.host);
    else if (!s.http.bind_to_port(s.opt.host, port))
        port = -1;
    ANVIL_CHECK(port > 0,
                "--host {} --port {}: cannot listen there (the port is in use, or the address is not this "
                "machine's); pick another --port, or 0 for any free one",
                s.opt.host, s.opt.port);
    if (fd != INVALID_SOCKET) ::listen(fd, SOMAXCONN);
    return port;
}

void Server::start() {
    impl_->thread = std::thread([this] { impl_->http.listen_after_bind(); });
}

void Server::refuse_new() {
    impl_->draining = true;
}

void Server::stop() {
    if (!impl_->thread.joinable()) return;
    impl_->http.stop();
    impl_->thread.join();
}

}  // namespace anvil::serve
