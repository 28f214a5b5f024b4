// anvil serve's HTTP/1.1 transport, on Boost.Beast's parser and serializer over sockets it owns: an accept
// loop with a cap on open connections, a thread a connection (handlers block on their sequences), keep-alive,
// and deadlines, so that a slow or idle client holds one connection and nothing else:
//  - a kept-alive connection waits --idle-timeout for its next request, then is closed;
//  - a request's header and body must arrive within --request-timeout of its first byte (408 otherwise), so
//    a client that sends a byte a second is cut off, however steadily it sends;
//  - each write must make progress within --request-timeout (a client that stops reading is dropped);
//  - past --max-connections, a new connection gets 503 and is closed at once.
// What the handler is given: the request (method, path, headers, body) and an exchange to answer it on, whole
// or as a chunked stream, and to ask whether its client has gone.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace anvil::serve {

struct HttpLimits {
    double max_body_mb = 4.0;         // larger bodies get 413
    int max_connections = 256;        // open at once; past it 503
    double idle_timeout_s = 60.0;     // between requests on a kept-alive connection
    double request_timeout_s = 30.0;  // a request's arrival from its first byte; a write's progress
};

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
    std::string method;
    std::string path;  // the target without its query
    std::string body;
    HttpHeaders headers;
    // The value of a header (names compare case-insensitively); nullptr when it is absent.
    const std::string* header(std::string_view name) const;
};

// One request's answer: reply() once, or open_stream(), chunks, close_stream(). A handler that does neither
// leaves the client without an answer (abandon(): it has gone) and the connection is closed.
class HttpExchange {
public:
    virtual ~HttpExchange() = default;
    virtual void reply(int status, std::string_view content_type, std::string body,
                       const HttpHeaders& extra = {}) = 0;
    // Sends the status and headers with chunked transfer; false when the client has gone.
    virtual bool open_stream(int status, std::string_view content_type, const HttpHeaders& extra = {}) = 0;
    virtual bool write_chunk(std::string_view data) = 0;  // false: the client has gone
    virtual void close_stream() = 0;
    // Whether the client hung up (polled, without reading).
    virtual bool client_gone() const = 0;
    // Nothing is sent: the client left; `status` is what the request is logged with (499, nginx's).
    virtual void abandon(int status) = 0;
};

using HttpHandler = std::function<void(const HttpRequest&, HttpExchange&)>;
// The body of an answer the transport gives itself (bad HTTP, too large, too slow, too many connections).
using HttpErrorBody = std::function<std::string(int status, const std::string& message)>;
// Called after every answer, with the request's path ("" when it was never read) and its status.
using HttpLog = std::function<void(const std::string& path, int status)>;

class HttpServer {
public:
    HttpServer(const HttpLimits& limits, HttpHandler handler, HttpErrorBody error_body, HttpLog log);
    ~HttpServer();
    // Listens on host:port (0: any free port) with the system's backlog; returns the port. Throws naming
    // --host/--port when it cannot.
    int bind(const std::string& host, int port);
    void start();  // accepts on a thread of its own until stop()
    // Stops accepting, closes idle connections, lets answers being written finish, and joins everything.
    void stop();
    int open_connections() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace anvil::serve
