#include "serve/metrics.h"

#include <fmt/format.h>

namespace anvil::serve {

void Histogram::observe(double seconds) {
    for (size_t i = 0; i < kBounds.size(); i++)
        if (seconds <= kBounds[i]) counts_[i]++;
    count_++;
    sum_ += seconds;
}

std::string Histogram::text(const std::string& name, const std::string& help) const {
    std::string out = fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
    for (size_t i = 0; i < kBounds.size(); i++)
        out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, kBounds[i], counts_[i]);
    out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, count_, name, sum_,
                       name, count_);
    return out;
}

void Metrics::on_first_token(double s) {
    std::lock_guard<std::mutex> lk(m_);
    ttft_.observe(s);
}

void Metrics::on_next_token(double s) {
    std::lock_guard<std::mutex> lk(m_);
    itl_.observe(s);
}

void Metrics::on_pass(int decode_rows, int /*prompt_rows*/) {
    std::lock_guard<std::mutex> lk(m_);
    passes_++;
    if (decode_rows == 0) return;
    steps_++;
    rows_ += uint64_t(decode_rows);
}

void Metrics::on_preempt() {
    std::lock_guard<std::mutex> lk(m_);
    preemptions_++;
}

void Metrics::on_admit(int positions) {
    std::lock_guard<std::mutex> lk(m_);
    prefix_queries_ += uint64_t(positions);
}

void Metrics::on_cached(int positions) {
    std::lock_guard<std::mutex> lk(m_);
    prefix_hits_ += uint64_t(positions);
}

void Metrics::on_request(const std::string& endpoint, int status) {
    std::lock_guard<std::mutex> lk(m_);
    requests_[{endpoint, status}]++;
}

void Metrics::on_generation(const std::string& reason, int64_t prompt_tokens, int64_t generated) {
    std::lock_guard<std::mutex> lk(m_);
    finished_[reason]++;
    prompt_tokens_ += uint64_t(prompt_tokens);
    generated_tokens_ += uint64_t(generated);
}

namespace {

std::string scalar(const char* name, const char* type, const char* help, double v) {
    return fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, v);
}

}  // namespace

std::string Metrics::text(const Scheduler::Load& load, double kv_cache_bytes, int connections) const {
    std::lock_guard<std::mutex> lk(m_);
    std::string out =
        "# HELP anvil_requests_total HTTP requests by endpoint and status code.\n"
        "# TYPE anvil_requests_total counter\n";
    for (const auto& [key, n] : requests_)
        out += fmt::format("anvil_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", key.first,
                           key.second, n);
    out +=
        "# HELP anvil_generations_finished_total Generations by how they ended (abandoned: the client "
        "left).\n"
        "# TYPE anvil_generations_finished_total counter\n";
    for (const auto& [reason, n] : finished_)
        out += fmt::format("anvil_generations_finished_total{{reason=\"{}\"}} {}\n", reason, n);
    out += scalar("anvil_prompt_tokens_total", "counter", "Prompt tokens prefilled.", double(prompt_tokens_));
    out += scalar("anvil_generation_tokens_total", "counter", "Tokens generated.", double(generated_tokens_));
    out +=
        scalar("anvil_forward_passes_total", "counter",
               "Batched forwards, each the decoding sequences' next tokens and prompt positions beside them.",
               double(passes_));
    out += scalar("anvil_decode_steps_total", "counter", "Forwards that advanced decoding sequences.",
                  double(steps_));
    out += scalar("anvil_decode_rows_total", "counter",
                  "Sequences those steps advanced (rows / steps = mean batch).", double(rows_));
    out += scalar("anvil_preemptions_total", "counter",
                  "Running sequences that gave their KV-cache pages to older ones (prefilled again later).",
                  double(preemptions_));
    out += scalar("anvil_prefix_cache_queries_total", "counter",
                  "Context positions of admitted requests looked up in the prefix cache.",
                  double(prefix_queries_));
    out += scalar("anvil_prefix_cache_hits_total", "counter",
                  "Of those, positions found there (their keys and values not computed again).",
                  double(prefix_hits_));
    out += ttft_.text("anvil_time_to_first_token_seconds", "From a request's arrival to its first token.");
    out += itl_.text("anvil_inter_token_latency_seconds", "Between consecutive tokens of a request.");
    out +=
        scalar("anvil_queue_length", "gauge", "Requests waiting for a KV-cache slot and pages.", load.queued);
    out += scalar("anvil_running_sequences", "gauge", "Sequences being decoded.", load.running);
    out += scalar("anvil_kv_cache_slots", "gauge", "KV-cache slots (sequences decoded together at most).",
                  load.slots);
    out += scalar("anvil_kv_cache_pages", "gauge", "KV-cache pages (16 positions of every layer each).",
                  load.pages);
    out += scalar("anvil_kv_cache_usage_ratio", "gauge",
                  "Fraction of the KV-cache pages lent to running sequences.",
                  load.pages ? double(load.pages_used) / load.pages : 0.0);
    out +=
        scalar("anvil_kv_cache_cached_pages", "gauge",
               "KV-cache pages no running sequence holds that keep a prefix for later requests (lent again "
               "when needed).",
               load.pages_cached);
    out += scalar("anvil_kv_cache_bytes", "gauge", "Size of the KV-cache pool.", kv_cache_bytes);
    out += scalar("anvil_open_connections", "gauge", "HTTP connections open (--max-connections at most).",
                  connections);
    return out;
}

}  // namespace anvil::serve
