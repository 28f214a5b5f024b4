// `anvil serve`'s API, on the HTTP transport (http.h): OpenAI's /v1/completions, /v1/chat/completions (plain
// or as server-sent events) and /v1/models, /health and /metrics, behind API keys when it has some (auth.h).
// Handlers run on their connection's thread and wait on their sequence; the scheduler (scheduler.h) runs the
// model on the caller's thread. Shutdown drains: new requests get 503, running ones finish (up to a
// deadline), then everything stops.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "serve/auth.h"
#include "serve/http.h"
#include "serve/metrics.h"
#include "serve/openai.h"
#include "serve/scheduler.h"

namespace anvil::serve {

struct ServerOptions {
    std::string host = "127.0.0.1";
    int port = 8080;           // 0: any free port
    HttpLimits limits;         // body size, connections, timeouts
    ApiKeys keys;              // on: every path but /health (and /metrics when public_metrics) needs one
    bool public_metrics = false;
};

class Server {
public:
    Server(Scheduler& sched, Metrics& metrics, const ServedModel& model, const ServerOptions& o);
    ~Server();
    // Binds the address; returns the port. Throws naming --host/--port when it cannot.
    int bind();
    // Serves on a thread of its own until stop().
    void start();
    // New requests get 503 and /health says draining from now on (shutdown: the scheduler finishes the rest).
    void refuse_new();
    void stop();  // stops listening and joins the handlers

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace anvil::serve
