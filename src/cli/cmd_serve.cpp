// anvil serve: an OpenAI-compatible HTTP server over one model, with continuous batching (serve/).
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include <fmt/format.h>

#include "cli/commands.h"
#include "serve/server.h"

namespace anvil::cli {

namespace {

// Set by SIGTERM/SIGINT (counted: a second one stops without waiting); read by the drain thread.
std::atomic<int> g_signals{0};
extern "C" void on_serve_signal(int) {
    g_signals++;
}

struct ServeOpts {
    serve::ServerOptions http;
    std::string name;
    double kv_cache_mb = 2048.0, drain_seconds = 30.0;
    int max_batch = 64, max_queue = 64, prefill_chunk = kPrefillChunk;
    std::string prefix_cache = "on";
    std::vector<std::string> api_keys;
    std::string api_key_file;
};

void add_serve_flags(CLI::App* sub, ServeOpts& o) {
    sub->add_option("--host", o.http.host, "address to listen on")->capture_default_str();
    sub->add_option("--port", o.http.port, "port to listen on (0 = any free port, printed at start)")
        ->capture_default_str()
        ->check(CLI::Range(0, 65535));
    sub->add_option("--served-model-name", o.name,
                    "the model id /v1/models lists and requests name (default: the model directory's name)");
    sub->add_option("--kv-cache-mb", o.kv_cache_mb,
                    "memory for the KV cache, in pages of 16 positions lent to requests as they grow (when "
                    "none is left, the newest running request waits to be recomputed); at least one whole "
                    "context")
        ->capture_default_str()
        ->check(kPositive);
    sub->add_option("--prefix-cache", o.prefix_cache,
                    "keep the KV-cache pages requests fill and give them to later requests whose context "
                    "begins with the same tokens (a shared system prompt, an earlier turn), which then "
                    "prefill only the rest: on or off")
        ->capture_default_str()
        ->check(CLI::IsMember({"on", "off"}));
    sub->add_option("--max-batch", o.max_batch, "at most this many sequences decoded together")
        ->capture_default_str()
        ->check(kPositive);
    sub->add_option(
           "--prefill-chunk", o.prefill_chunk,
           "prompt positions an iteration, in the decode step's forward (chunked prefill): a long prompt "
           "slows the running sequences by one chunk at a time; 0 = whole prompts at once. Answers equal "
           "`anvil generate`'s at the default")
        ->capture_default_str()
        ->check(kNonNegative);
    sub->add_option("--max-queue", o.max_queue,
                    "requests that may wait for a free sequence; past it the server answers 429")
        ->capture_default_str()
        ->check(kNonNegative);
    sub->add_option("--max-body-mb", o.http.limits.max_body_mb, "larger request bodies get 413")
        ->capture_default_str()
        ->check(kPositive);
    sub->add_option("--max-connections", o.http.limits.max_connections,
                    "HTTP connections open at once; past it a new one gets 503 and is closed")
        ->capture_default_str()
        ->check(kPositive);
    sub->add_option("--idle-timeout", o.http.limits.idle_timeout_s,
                    "seconds a kept-alive connection may wait for its next request before it is closed")
        ->capture_default_str()
        ->check(kPositive);
    sub->add_option("--request-timeout", o.http.limits.request_timeout_s,
                    "seconds a request's header and body have, from its first byte, to arrive (408 past "
                    "it: a client that sends a byte a second is cut off); each write of an answer must "
                    "progress within it too")
        ->capture_default_str()
        ->check(kPositive);
    sub->add_option(
           "--api-key", o.api_keys,
           "let in only requests with `Authorization: Bearer KEY` (401 otherwise; /health stays open); "
           "repeat for several keys. Also --api-key-file and the ANVIL_API_KEY environment variable "
           "(keys separated by commas), which add to these")
        ->type_name("KEY");
    sub->add_option(
        "--api-key-file", o.api_key_file,
        "API keys from a file, one a line (# starts a comment): keeps them out of the process list");
    sub->add_flag("--public-metrics", o.http.public_metrics,
                  "with API keys, let /metrics be read without one (for a Prometheus scraper)");
    sub->add_option("--drain-seconds", o.drain_seconds,
                    "on SIGTERM or Ctrl-C: stop accepting, let running requests finish for up to this long, "
                    "then exit")
        ->capture_default_str()
        ->check(kNonNegative);
}

// The scheduler's options: --kv-cache-mb in pages (at least one whole context, no more than --max-batch use)
serve::SchedulerOptions scheduler_options(const ServeOpts& o, const Model& model) {
    const ModelConfig& c = model.config();
    const double mib = 1024.0 * 1024.0;
    const int context_pages = KvCache::pages_for(c.n_ctx);  // of the default page
    const double fit = std::floor(o.kv_cache_mb * mib / double(model.cache_page_bytes()));
    ANVIL_CHECK(
        fit >= context_pages,
        "--kv-cache-mb {}: one sequence's keys and values over the context of {} take {:.1f} MiB; give "
        "at least that",
        o.kv_cache_mb, c.n_ctx, double(model.cache_slot_bytes()) / mib);
    serve::SchedulerOptions so;
    so.slots = o.max_batch;
    so.kv_pages = int(std::min(fit, double(o.max_batch) * context_pages));
    so.max_queue = o.max_queue;
    so.prefill_chunk = o.prefill_chunk;
    so.prefix_caching = o.prefix_cache == "on";
    return so;
}

// What the API says about the model: its name, context, tokenizer, template and stops
serve::ServedModel served_model(const ServeOpts& o, const InferenceSetup& l,
                                const serve::SchedulerOptions& so) {
    serve::ServedModel served;
    const std::string dir = l.adapter_dir.empty() ? l.base_dir : l.adapter_dir;
    served.name = o.name.empty() ? default_model_name(dir) : o.name;
    served.n_ctx = l.model->config().n_ctx;
    served.tok = l.tok.get();
    served.prompt = l.prompt;
    served.stop_tokens = stop_tokens(l.prompt, *l.tok);
    served.created = int64_t(std::time(nullptr));
    served.max_prompts = so.slots + so.max_queue;  // what an idle server can take in one request
    return served;
}

// The drain, on a thread of its own: on the first signal refuse new requests and wait for the running and
// queued ones (a second signal or --drain-seconds cuts it short), then stop the scheduler, which returns its
// run(); `over` ends the thread without a signal.
void drain(serve::Server& server, serve::Scheduler& sched, double seconds, const std::atomic<bool>& over) {
    while (!over && g_signals == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (over) return;
    server.refuse_new();
    const serve::Scheduler::Load at = sched.load();
    std::fprintf(stderr, "anvil: stopping: new requests get 503; waiting up to %.0f s for %d running\n",
                 seconds, at.running + at.queued);
    const auto deadline = serve::Clock::now() + std::chrono::duration<double>(seconds);
    while (!sched.load().idle() && g_signals < 2 && serve::Clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (const serve::Scheduler::Load left = sched.load(); !left.idle())
        std::fprintf(stderr, "anvil: stopping with %d requests unfinished (they get 503)\n",
                     left.running + left.queued);
    sched.stop();
}

int run_serve(const ModelFlags& mf, ServeOpts o) {
    o.http.keys = serve::load_api_keys(o.api_keys, o.api_key_file, std::getenv("ANVIL_API_KEY"));
    InferenceSetup l = mf.load();
    Model& model = *l.model;
    const ModelConfig& c = model.config();
    const serve::SchedulerOptions so = scheduler_options(o, model);
    serve::Metrics metrics;
    serve::Scheduler sched(model, so, &metrics);
    const serve::ServedModel served = served_model(o, l, so);
    const double mib = 1024.0 * 1024.0, kv_bytes = double(sched.cache_bytes());
    const std::string prefill =
        so.prefill_chunk > 0 ? fmt::format("{} positions a step", so.prefill_chunk) : "whole";
    serve::Server server(sched, metrics, served, o.http);
    const int port = server.bind();
    std::fprintf(stderr,
                 "anvil: serving %s (%s%s, context %d, chat template %s) on http://%s:%d\n"
                 "anvil: KV cache: %.1f MiB in %d pages of %d positions (a whole context: %.1f MiB), up to "
                 "%d sequences decoded together and %d waiting; prompts prefilled %s; prefix caching %s\n",
                 served.name.c_str(), c.model_type.c_str(), c.int8_weights ? ", int8 weights" : "", c.n_ctx,
                 template_name(l.prompt), o.http.host.c_str(), port, kv_bytes / mib, sched.cache_pages(),
                 so.kv_page, double(model.cache_slot_bytes()) / mib, so.slots, so.max_queue, prefill.c_str(),
                 o.prefix_cache.c_str());
    if (o.http.keys.on())
        std::fprintf(stderr, "anvil: %zu API key%s (Authorization: Bearer KEY); /health open, /metrics %s\n",
                     o.http.keys.size(), o.http.keys.size() == 1 ? "" : "s",
                     o.http.public_metrics ? "open (--public-metrics)" : "needs a key");
    else
        std::fprintf(stderr,
                     "anvil: no API key: anyone who reaches %s:%d is let in (--api-key to require one)\n",
                     o.http.host.c_str(), port);
    std::fflush(stderr);
    for (int sig : {SIGINT, SIGTERM}) std::signal(sig, on_serve_signal);
    std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is the write's error, not the process's end
    std::atomic<bool> over{false};
    std::thread drainer([&] { drain(server, sched, o.drain_seconds, over); });
    struct Join {  // the drainer ends before this scope does, however run() returns
        std::atomic<bool>& over;
        std::thread& t;
        ~Join() {
            over = true;
            t.join();
        }
    } join{over, drainer};
    server.start();
    sched.run();  // the model's thread: this one, where the backend was set up
    server.stop();
    std::fprintf(stderr, "anvil: stopped\n");
    return 0;
}

}  // namespace

Command add_serve(CLI::App& app) {
    CLI::App* sub = app.add_subcommand(
        "serve",
        "serve a model over HTTP with OpenAI's API (/v1/completions, /v1/chat/completions, /v1/models), "
        "/health and /metrics; requests are batched continuously");
    auto mf = std::make_shared<ModelFlags>();
    auto o = std::make_shared<ServeOpts>();
    mf->add(sub);
    add_serve_flags(sub, *o);
    return {sub, [mf, o] { return run_serve(*mf, *o); }};
}

}  // namespace anvil::cli
