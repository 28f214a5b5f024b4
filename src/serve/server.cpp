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
    TextStream text;
    size_t seen = 0;
    Finish finish = Finish::None;  // != None: the generation is over
    std::string error;             // with Finish::Error
    std::vector<int32_t> ids;      // every token so far, and (when asked for) their log-probabilities
    std::vector<TokenLogprob> logprobs;
    size_t fresh = 0;  // ids[fresh..] came with the last next()

    // Waits up to kPoll; returns the text that may be shown since the last call (the rest once it is over).
    std::string next() {
        Sequence::Update u = seq->wait(seen, kPoll);
        seen += u.tokens.size();
        fresh = ids.size();
        ids.insert(ids.end(), u.tokens.begin(), u.tokens.end());
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
    // ids[from..] with their log-probabilities
    std::vector<LogprobItem> items(size_t from) const {
        std::vector<LogprobItem> out;
        for (size_t k = from; k < ids.size() && k < logprobs.size(); k++)
            out.push_back({ids[k], &logprobs[k]});
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
    void reply_whole(const GenerationRequest& r, const ResponseHead& h, std::shared_ptr<Sequence> seq,
                     const httplib::Request& req, httplib::Response& res);
    void reply_stream(const GenerationRequest& r, const ResponseHead& h, std::shared_ptr<Sequence> seq,
                      httplib::Response& res);
};

void Server::Impl::generate(Endpoint endpoint, const httplib::Request& req, httplib::Response& res) {
    try {
        if (draining) throw shutting_down();
        const GenerationRequest r = parse_request(endpoint, req.body, model, random_seed());
        std::shared_ptr<Sequence> seq = sched.submit(r.prompt, r.sample, r.logprobs);
        if (!seq) {
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
            reply_stream(r, h, std::move(seq), res);
        else
            reply_whole(r, h, std::move(seq), req, res);
    } catch (const ApiError& e) {
        send_error(res, e);
    }
}

void Server::Impl::reply_whole(const GenerationRequest& r, const ResponseHead& h,
                               std::shared_ptr<Sequence> seq, const httplib::Request& req,
                               httplib::Response& res) {
    Follower f(std::move(seq), *model.tok, r.stop);
    const ClientWatch client(req);
    const int P = int(r.prompt.size());
    while (f.finish == Finish::None) {
        f.next();
        // the client left: its sequence ends and frees the slot
        if (f.finish == Finish::None && client.gone()) {
            f.seq->cancel();
            metrics.on_generation("abandoned", P, f.text.tokens());
            res.status = 499;  // nobody reads it; nginx's "client closed request", for the request counters
            return;
        }
    }
    metrics.on_generation(finish_name(f.finish), P, f.text.tokens());
    if (f.ended_badly()) throw ended_error(f.finish, f.error);
    // echo: the prompt's text before the completion's, its tokens (and their log-probabilities) before them
    const std::string prompt_text =
        r.echo || h.endpoint == Endpoint::Completions ? model.tok->decode(r.prompt) : "";
    nlohmann::json lp;
    if (r.logprobs.top >= 0 && h.endpoint == Endpoint::Chat) {
        lp = chat_logprobs(*model.tok, f.items(0), r.token_ids);
    } else if (r.logprobs.top >= 0) {
        std::vector<LogprobItem> items;
        std::vector<TokenLogprob> prompt_lp;
        size_t offset = 0;
        if (r.echo) {
            prompt_lp = f.seq->prompt_logprobs();
            for (size_t k = 0; k < r.prompt.size(); k++)
                items.push_back({r.prompt[k], k == 0 || k > prompt_lp.size() ? nullptr : &prompt_lp[k - 1]});
        } else {
            offset = utf8_length(prompt_text);  // OpenAI counts offsets in the prompt and completion together
        }
        for (const LogprobItem& it : f.items(0)) items.push_back(it);
        lp = completion_logprobs(*model.tok, items, offset, r.token_ids);
    }
    send_json(res, 200,
              completion_response(h, (r.echo ? prompt_text : "") + f.text.text(), finish_name(f.finish), P,
                                  f.text.tokens(), lp));
}

void Server::Impl::reply_stream(const GenerationRequest& r, const ResponseHead& h,
                                std::shared_ptr<Sequence> seq, httplib::Response& res) {
    struct State {
        explicit State(Follower f) : f(std::move(f)) {}
        Follower f;
        bool first = true, done = false;
        size_t offset = 0;
    };
    auto st = std::make_shared<State>(Follower(std::move(seq), *model.tok, r.stop));
    const int P = int(r.prompt.size());
    // completions' text offsets count from the prompt's end
    st->offset = r.logprobs.top >= 0 && h.endpoint == Endpoint::Completions
                     ? utf8_length(model.tok->decode(r.prompt))
                     : 0;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, st, h, P, usage = r.include_usage, want_lp = r.logprobs.top >= 0, ids = r.token_ids](
            size_t, httplib::DataSink& sink) {
            Follower& f = st->f;
            std::string out;
            if (st->first && h.endpoint == Endpoint::Chat) {  // the role first, as OpenAI sends it
                out += sse(stream_chunk(h, "", nullptr, true));
                st->first = false;
            }
            const std::string delta = f.next();
            // the log-probabilities of the tokens that came with this delta (their text may be held back)
            nlohmann::json lp;
            if (want_lp && f.logprobs.size() > f.fresh)
                lp = h.endpoint == Endpoint::Chat
                         ? chat_logprobs(*model.tok, f.items(f.fresh), ids)
                         : completion_logprobs(*model.tok, f.items(f.fresh), st->offset, ids);
            if (!delta.empty() || !lp.is_null()) {
                out += sse(stream_chunk(h, delta, nullptr, st->first, lp));
                st->first = false;
            }
            if (f.finish != Finish::None) {
                if (f.ended_badly())
                    out += sse(error_body(ended_error(f.finish, f.error)));
                else
                    out += sse(stream_chunk(h, "", finish_name(f.finish), st->first));
                if (usage) out += sse(usage_chunk(h, P, f.text.tokens()));
                out += "data: [DONE]\n\n";
                metrics.on_generation(finish_name(f.finish), P, f.text.tokens());
                st->done = true;
            }
            // a client that left: its sequence ends and frees the slot
            if (!out.empty() && !sink.write(out.data(), out.size())) return false;
            if (!sink.is_writable()) return false;
            if (st->done) sink.done();
            return true;
        },
        [this, st, P](bool success) {
            if (success && st->done) return;
            st->f.seq->cancel();  // the client left before the end
            if (!st->done) metrics.on_generation("abandoned", P, st->f.text.tokens());
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
