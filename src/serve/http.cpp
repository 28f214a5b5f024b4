#include "serve/http.h"

#define BOOST_BEAST_USE_STD_STRING_VIEW
#include <fmt/format.h>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "core/error.h"

namespace anvil::serve {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace net = boost::asio;

namespace {

using WallClock = std::chrono::steady_clock;
constexpr auto kSlice = std::chrono::milliseconds(100);  // how often a waiting connection looks at stop()
constexpr size_t kHeaderLimit = 16 * 1024;               // a request's header: larger gets 431
constexpr int kMaxRefusing = 64;  // connections being told 503 at once; past it they are closed unanswered
constexpr double kRefuseTimeout = 2.0;  // a refused connection's request must arrive within this

WallClock::time_point after(double seconds) {
    return WallClock::now() +
           std::chrono::duration_cast<WallClock::duration>(std::chrono::duration<double>(seconds));
}

// A connected non-blocking socket as Beast's SyncReadStream and SyncWriteStream. Reads and writes wait in
// poll() and fail with beast::error::timeout past `deadline`; a read also ends (operation_aborted) once the
// server stops.
class DeadlineSocket {
public:
    DeadlineSocket(int fd, const std::atomic<bool>& stopping) : fd_(fd), stopping_(stopping) {}
    WallClock::time_point deadline = WallClock::now();

    template <class Buffers>
    size_t read_some(const Buffers& buffers, beast::error_code& ec) {
        ec = {};
        for (auto it = net::buffer_sequence_begin(buffers); it != net::buffer_sequence_end(buffers); ++it) {
            const net::mutable_buffer b = *it;
            if (b.size() == 0) continue;
            for (;;) {
                const ssize_t n = ::recv(fd_, b.data(), b.size(), 0);
                if (n > 0) return size_t(n);
                if (n == 0) {
                    ec = net::error::eof;
                    return 0;
                }
                if (errno == EINTR) continue;
                if (errno != EAGAIN && errno != EWOULDBLOCK) return fail(ec);
                if (!wait(POLLIN, true, deadline, ec)) return 0;
            }
        }
        return 0;
    }
    template <class Buffers>
    size_t read_some(const Buffers& buffers) {
        return or_throw([&](beast::error_code& ec) { return read_some(buffers, ec); });
    }

    template <class Buffers>
    size_t write_some(const Buffers& buffers, beast::error_code& ec) {
        ec = {};
        iovec iov[16];
        size_t k = 0;
        for (auto it = net::buffer_sequence_begin(buffers); it != net::buffer_sequence_end(buffers) && k < 16;
             ++it) {
            const net::const_buffer b = *it;
            if (b.size() > 0) iov[k++] = {const_cast<void*>(b.data()), b.size()};
        }
        if (k == 0) return 0;
        msghdr m{};
        m.msg_iov = iov;
        m.msg_iovlen = k;
        for (;;) {
            const ssize_t n = ::sendmsg(fd_, &m, MSG_NOSIGNAL);
            if (n >= 0) return size_t(n);
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) return fail(ec);
            if (!wait(POLLOUT, false, deadline, ec)) return 0;
        }
    }
    template <class Buffers>
    size_t write_some(const Buffers& buffers) {
        return or_throw([&](beast::error_code& ec) { return write_some(buffers, ec); });
    }

    // Waits until the socket is ready for `events` (or the peer hung up): false at `until` (timeout) or, when
    // `stop_ends`, once the server stops (operation_aborted).
    bool wait(short events, bool stop_ends, WallClock::time_point until, beast::error_code& ec) const {
        for (;;) {
            if (stop_ends && stopping_) {
                ec = net::error::operation_aborted;
                return false;
            }
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - WallClock::now());
            if (left.count() <= 0) {
                ec = beast::error::timeout;
                return false;
            }
            pollfd p{fd_, events, 0};
            const int r = ::poll(&p, 1, int(std::min(left, kSlice).count()));
            if (r > 0) return true;
            if (r < 0 && errno != EINTR) {
                ec.assign(errno, boost::system::system_category());
                return false;
            }
        }
    }

    bool peer_gone() const {
        pollfd p{fd_, POLLRDHUP, 0};
        return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
    }

private:
    // The throwing form of a read or write (Beast's stream concepts ask for both).
    template <class Op>
    static size_t or_throw(Op op) {
        beast::error_code ec;
        const size_t n = op(ec);
        if (ec) throw beast::system_error(ec);
        return n;
    }
    size_t fail(beast::error_code& ec) const {
        ec.assign(errno, boost::system::system_category());
        return 0;
    }
    int fd_;
    const std::atomic<bool>& stopping_;
};

class Exchange final : public HttpExchange {
public:
    Exchange(DeadlineSocket& s, double timeout_s, bool keep_alive)
        : s_(s), timeout_s_(timeout_s), keep_alive_(keep_alive) {}

    void reply(int status, std::string_view content_type, std::string body,
               const HttpHeaders& extra) override {
        if (state_ != State::Open) return;
        bhttp::response<bhttp::string_body> res;
        head(res, status, content_type, extra);
        res.body() = std::move(body);
        res.prepare_payload();
        s_.deadline = after(timeout_s_);
        beast::error_code ec;
        bhttp::write(s_, res, ec);
        ok_ = !ec;
        state_ = State::Done;
    }
    bool open_stream(int status, std::string_view content_type, const HttpHeaders& extra) override {
        if (state_ != State::Open) return false;
        bhttp::response<bhttp::empty_body> res;
        head(res, status, content_type, extra);
        res.chunked(true);
        bhttp::response_serializer<bhttp::empty_body> sr{res};
        s_.deadline = after(timeout_s_);
        beast::error_code ec;
        bhttp::write_header(s_, sr, ec);
        ok_ = !ec;
        state_ = State::Streaming;
        return ok_;
    }
    bool write_chunk(std::string_view data) override {
        if (state_ != State::Streaming || !ok_) return false;
        if (data.empty()) return true;  // an empty chunk would end the body
        s_.deadline = after(timeout_s_);
        beast::error_code ec;
        net::write(s_, bhttp::make_chunk(net::const_buffer(data.data(), data.size())), ec);
        ok_ = !ec;
        return ok_;
    }
    void close_stream() override {
        if (state_ != State::Streaming) return;
        if (ok_) {
            s_.deadline = after(timeout_s_);
            beast::error_code ec;
            net::write(s_, bhttp::make_chunk_last(), ec);
            ok_ = !ec;
        }
        state_ = State::Done;
    }
    bool client_gone() const override { return !ok_ || s_.peer_gone(); }
    void abandon(int status) override {
        status_ = status;
        ok_ = false;
        state_ = State::Done;
    }

    int status() const { return status_; }
    bool answered() const { return state_ != State::Open; }
    // The connection may take another request.
    bool reusable() const { return state_ == State::Done && ok_ && keep_alive_; }

private:
    template <class Message>
    void head(Message& res, int status, std::string_view content_type, const HttpHeaders& extra) {
        status_ = status;
        res.version(11);
        res.result(unsigned(status));
        res.set(bhttp::field::server, "anvil");
        res.set(bhttp::field::content_type, content_type);
        for (const auto& [name, value] : extra) res.set(name, value);
        res.keep_alive(keep_alive_);
    }

    enum class State { Open, Streaming, Done };
    DeadlineSocket& s_;
    double timeout_s_;
    bool keep_alive_;
    State state_ = State::Open;
    bool ok_ = true;
    int status_ = 0;
};

// The status a request that could not be read gets, with why; 0: nobody to answer (the client left, or the
// server stops).
int read_failure(const beast::error_code& ec, const HttpLimits& l, std::string& why) {
    if (ec == beast::error::timeout) {
        why = fmt::format("the request did not arrive within the server's --request-timeout of {} s",
                          l.request_timeout_s);
        return 408;
    }
    if (ec == bhttp::error::body_limit) {
        why = "the request body is larger than the server's --max-body-mb";
        return 413;
    }
    if (ec == bhttp::error::header_limit) {
        why = fmt::format("the request's header is larger than {} KiB", kHeaderLimit / 1024);
        return 431;
    }
    if (ec.category() == bhttp::make_error_code(bhttp::error::bad_method).category() &&
        ec != bhttp::error::partial_message && ec != bhttp::error::end_of_stream) {
        why = "malformed HTTP request: " + ec.message();
        return 400;
    }
    return 0;
}

HttpRequest to_request(bhttp::request<bhttp::string_body>&& m) {
    HttpRequest q;
    q.method = std::string(m.method_string());
    const std::string_view target = m.target();
    q.path = std::string(target.substr(0, target.find('?')));
    for (const auto& f : m) q.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
    q.body = std::move(m.body());
    return q;
}

}  // namespace

const std::string* HttpRequest::header(std::string_view name) const {
    for (const auto& [n, v] : headers)
        if (beast::iequals(n, name)) return &v;
    return nullptr;
}

struct HttpServer::Impl {
    HttpLimits limits;
    HttpHandler handler;
    HttpErrorBody error_body;
    HttpLog log;
    int listen_fd = -1;
    std::thread acceptor;
    std::atomic<bool> stopping{false};
    mutable std::mutex m;
    std::condition_variable cv;
    int open = 0;      // connections being served
    int refusing = 0;  // connections being told 503

    void accept_loop();
    // One connection, on a thread of its own, until it closes; a refused one gets 503 for its request.
    void serve(int fd, bool refuse);
    // Reads the next request on `s`; false when there is none (closed, idle too long, unreadable: answered).
    bool read_request(DeadlineSocket& s, beast::flat_buffer& buf, bool refuse, HttpRequest& q, bool& keep);
    void answer_error(DeadlineSocket& s, int status, const std::string& why, const std::string& path);
};

void HttpServer::Impl::accept_loop() {
    while (!stopping) {
        pollfd p{listen_fd, POLLIN, 0};
        if (::poll(&p, 1, int(kSlice.count())) <= 0) continue;
        const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE)
                std::this_thread::sleep_for(kSlice);  // out of descriptors
            continue;
        }
        int one = 1;  // a stream's events leave at once, not when Nagle's algorithm lets them
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        bool refuse = false;
        {
            std::lock_guard<std::mutex> lk(m);
            refuse = open >= limits.max_connections;
            if (refuse && refusing >= kMaxRefusing) {
                ::close(fd);
                continue;
            }
            (refuse ? refusing : open)++;
        }
        try {
            std::thread([this, fd, refuse] { serve(fd, refuse); }).detach();
        } catch (const std::system_error&) {  // no thread to be had: as a refusal past the cap
            ::close(fd);
            std::lock_guard<std::mutex> lk(m);
            (refuse ? refusing : open)--;
        }
    }
}

bool HttpServer::Impl::read_request(DeadlineSocket& s, beast::flat_buffer& buf, bool refuse, HttpRequest& q,
                                    bool& keep) {
    beast::error_code ec;
    // idle: the next request's first byte (or the client's hang-up) within --idle-timeout
    if (buf.size() == 0 && !s.wait(POLLIN, true, after(limits.idle_timeout_s), ec)) return false;
    bhttp::request_parser<bhttp::string_body> p;
    p.body_limit(uint64_t(limits.max_body_mb * 1024.0 * 1024.0));
    p.header_limit(uint32_t(kHeaderLimit));
    s.deadline = after(refuse ? kRefuseTimeout : limits.request_timeout_s);
    bhttp::read_header(s, buf, p, ec);
    if (!ec && beast::iequals(p.get()[bhttp::field::expect], "100-continue") && !refuse)
        net::write(s, net::buffer(std::string_view("HTTP/1.1 100 Continue\r\n\r\n")), ec);
    if (!ec) bhttp::read(s, buf, p, ec);
    if (ec) {
        std::string why;
        const int status = refuse ? 0 : read_failure(ec, limits, why);
        const std::string path = p.is_header_done() ? std::string(p.get().target()) : "";
        if (status != 0) answer_error(s, status, why, path.substr(0, path.find('?')));
        return false;
    }
    keep = p.get().keep_alive();
    q = to_request(p.release());
    return true;
}

void HttpServer::Impl::answer_error(DeadlineSocket& s, int status, const std::string& why,
                                    const std::string& path) {
    Exchange ex(s, 1.0, false);
    ex.reply(status, "application/json", error_body(status, why), {});
    log(path, status);
}

void HttpServer::Impl::serve(int fd, bool refuse) {
    DeadlineSocket s(fd, stopping);
    beast::flat_buffer buf;  // keeps what a client sent past its request (pipelining)
    HttpRequest q;
    bool keep = false;
    if (refuse) {
        if (read_request(s, buf, true, q, keep))
            answer_error(s, 503,
                         fmt::format("the server has its --max-connections of {} open; retry later",
                                     limits.max_connections),
                         q.path);
    } else {
        while (!stopping && read_request(s, buf, false, q, keep)) {
            Exchange ex(s, limits.request_timeout_s, keep && !stopping);
            try {
                handler(q, ex);
            } catch (const std::exception& e) {
                ex.reply(500, "application/json", error_body(500, e.what()), {});
            }
            if (!ex.answered()) ex.reply(500, "application/json", error_body(500, "no answer"), {});
            log(q.path, ex.status());
            if (!ex.reusable()) break;
        }
    }
    ::shutdown(fd, SHUT_WR);
    ::close(fd);
    std::lock_guard<std::mutex> lk(m);
    (refuse ? refusing : open)--;
    cv.notify_all();
}

HttpServer::HttpServer(const HttpLimits& limits, HttpHandler handler, HttpErrorBody error_body, HttpLog log)
    : impl_(std::make_unique<Impl>()) {
    impl_->limits = limits;
    impl_->handler = std::move(handler);
    impl_->error_body = std::move(error_body);
    impl_->log = std::move(log);
}

HttpServer::~HttpServer() {
    stop();
    if (impl_->listen_fd >= 0) ::close(impl_->listen_fd);
}

int HttpServer::bind(const std::string& host, int port) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    addrinfo* found = nullptr;
    int fd = -1;
    if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) == 0) {
        for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
            fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
            if (fd < 0) continue;
            // SO_REUSEADDR only (not SO_REUSEPORT): a second server on the port is told it is taken
            int yes = 1;
            ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
            if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
                ::close(fd);
                fd = -1;
            }
        }
        ::freeaddrinfo(found);
    }
    ANVIL_CHECK(fd >= 0,
                "--host {} --port {}: cannot listen there (the port is in use, or the address is not this "
                "machine's); pick another --port, or 0 for any free one",
                host, port);
    sockaddr_storage a{};
    socklen_t n = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
    impl_->listen_fd = fd;
    return a.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port)
                                   : ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port);
}

void HttpServer::start() {
    impl_->acceptor = std::thread([this] { impl_->accept_loop(); });
}

void HttpServer::stop() {
    Impl& s = *impl_;
    s.stopping = true;
    if (s.acceptor.joinable()) s.acceptor.join();
    std::unique_lock<std::mutex> lk(s.m);
    s.cv.wait(lk, [&s] { return s.open == 0 && s.refusing == 0; });
}

int HttpServer::open_connections() const {
    std::lock_guard<std::mutex> lk(impl_->m);
    return impl_->open;
}

}  // namespace anvil::serve
