#include "serve/openai.h"

#include <fmt/format.h>

#include <algorithm>

namespace anvil::serve {

nlohmann::json error_body(const ApiError& e) {
    return {{"error",
             {{"message", e.what()},
              {"type", e.type},
              {"param", e.param.empty() ? nlohmann::json() : nlohmann::json(e.param)},
              {"code", e.code.empty() ? nlohmann::json() : nlohmann::json(e.code)}}}};
}

namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& param, const std::string& message) {
    throw ApiError(400, message, param);
}

// An optional field of a type: absent or null leaves `out` as it is.
template <class T, class Check>
void field(const json& j, const char* name, T& out, Check is_type, const char* type) {
    const auto it = j.find(name);
    if (it == j.end() || it->is_null()) return;
    if (!is_type(*it)) bad(name, fmt::format("'{}' must be {}, got {}", name, type, it->dump()));
    out = it->get<T>();
}

bool is_int(const json& v) {
    return v.is_number_integer();
}
bool is_num(const json& v) {
    return v.is_number();
}
bool is_bool(const json& v) {
    return v.is_boolean();
}

// The text of a message's content: a string, or OpenAI's list of parts ({"type": "text", "text": ...}).
std::string content_text(const json& c, size_t i) {
    const std::string param = fmt::format("messages[{}].content", i);
    if (c.is_string()) return c.get<std::string>();
    if (!c.is_array()) bad(param, fmt::format("'{}' must be a string or a list of text parts", param));
    std::string out;
    for (const json& part : c) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string())
            bad(param,
                fmt::format("'{}': only text parts ({{\"type\": \"text\", \"text\": ...}}) are supported",
                            param));
        out += part["text"].get<std::string>();
    }
    return out;
}

std::vector<int32_t> chat_prompt(const json& body, const ServedModel& m) {
    const auto it = body.find("messages");
    if (it == body.end() || it->is_null()) bad("messages", "'messages' is required");
    if (!it->is_array() || it->empty()) bad("messages", "'messages' must be a non-empty list of messages");
    Example conv;
    bool user = false;
    for (size_t i = 0; i < it->size(); i++) {
        const json& msg = (*it)[i];
        const std::string param = fmt::format("messages[{}]", i);
        if (!msg.is_object() || !msg.contains("role") || !msg["role"].is_string())
            bad(param, fmt::format("'{}' must be an object with a 'role' and a 'content'", param));
        std::string role = msg["role"].get<std::string>();
        if (role == "developer") role = "system";  // OpenAI's newer name for the system message
        Role r;
        if (!parse_role(role, &r))
            bad(param + ".role", fmt::format("'{}.role' is '{}'; expected system, user or assistant", param,
                                             msg["role"].get<std::string>()));
        if (r == Role::System && i > 0)
            bad(param, fmt::format("'{}': a system message must come first", param));
        if (!msg.contains("content") || msg["content"].is_null())
            bad(param + ".content", fmt::format("'{}.content' is required", param));
        user = user || r == Role::User;
        conv.messages.push_back({r, content_text(msg["content"], i)});
    }
    if (!user) bad("messages", "'messages' has no user message to answer");
    if (conv.messages.back().role != Role::User)
        bad("messages", "the last message must be the user's: the reply follows it");
    if (const std::string why = template_problem(conv, m.prompt, *m.tok); !why.empty())
        bad("messages", "'messages' " + why);
    return prompt_tokens(conv, m.prompt, *m.tok);
}

// Completions' logprobs (an integer: how many likeliest tokens beside each) and echo; chat's logprobs (a
// boolean) and top_logprobs.
void logprob_fields(const json& j, Endpoint endpoint, GenerationRequest& r) {
    constexpr int kMaxTop = LogprobRequest::kMaxTop;
    field(j, "return_tokens_as_token_ids", r.token_ids, is_bool, "a boolean");
    const auto top_in_range = [&](const char* name, int64_t v) {
        if (v < 0 || v > kMaxTop)
            bad(name, fmt::format("'{}' must be from 0 to {}, got {}", name, kMaxTop, v));
        return int(v);
    };
    if (endpoint == Endpoint::Completions) {
        int64_t top = -1;
        field(j, "logprobs", top, is_int, "an integer (how many likeliest tokens to list beside each)");
        if (top != -1) r.logprobs.top = top_in_range("logprobs", top);
        field(j, "echo", r.echo, is_bool, "a boolean");
        r.logprobs.prompt = r.echo && r.logprobs.top >= 0;
        if (j.contains("top_logprobs") && !j["top_logprobs"].is_null())
            bad("top_logprobs", "'top_logprobs' is the chat API's; completions take 'logprobs': N");
        return;
    }
    bool want = false;
    field(j, "logprobs", want, is_bool, "a boolean");
    int64_t top = 0;
    field(j, "top_logprobs", top, is_int, "an integer");
    top = top_in_range("top_logprobs", top);
    if (top > 0 && !want) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    if (want) r.logprobs.top = int(top);
    if (j.contains("echo") && !j["echo"].is_null() && j["echo"] != false)
        bad("echo", "'echo' is the completions API's; chat completions do not repeat the messages");
}

// A prompt of token ids: a non-empty list of integers in the vocabulary (else empty).
std::vector<int32_t> token_prompt(const json& p, const ServedModel& m, const std::string& param) {
    if (!p.is_array() || p.empty() || !std::all_of(p.begin(), p.end(), is_int)) return {};
    std::vector<int32_t> ids;
    for (const json& v : p) {
        const int64_t id = v.get<int64_t>();
        if (id < 0 || id >= m.tok->vocab_size())
            bad("prompt",
                fmt::format("'{}' token {} is outside the vocabulary of {}", param, id, m.tok->vocab_size()));
        ids.push_back(int32_t(id));
    }
    return ids;
}

// OpenAI's forms: a string, a list of token ids, or a list of several of either (a choice each).
std::vector<std::vector<int32_t>> completion_prompts(const json& body, const ServedModel& m) {
    const auto it = body.find("prompt");
    if (it == body.end() || it->is_null()) bad("prompt", "'prompt' is required");
    const json& p = *it;
    if (p.is_string()) return {m.tok->encode_prompt(p.get<std::string>())};
    if (std::vector<int32_t> ids = token_prompt(p, m, "prompt"); !ids.empty()) return {ids};
    const char* form = "'prompt' must be a string, a list of token ids, or a list of several of either";
    if (!p.is_array() || p.empty()) bad("prompt", form);
    if (int(p.size()) > m.max_prompts)
        bad("prompt", fmt::format("'prompt' lists {} prompts; this server takes at most {} in one request "
                                  "(its sequences and queue)",
                                  p.size(), m.max_prompts));
    std::vector<std::vector<int32_t>> out;
    for (size_t i = 0; i < p.size(); i++) {
        const std::string param = fmt::format("prompt[{}]", i);
        if (p[i].is_string()) {
            out.push_back(m.tok->encode_prompt(p[i].get<std::string>()));
        } else {
            out.push_back(token_prompt(p[i], m, param));
            if (out.back().empty())
                bad("prompt", fmt::format("'{}' must be a string or a list of token ids", param));
        }
    }
    return out;
}

std::vector<std::string> stop_strings(const json& body) {
    const auto it = body.find("stop");
    if (it == body.end() || it->is_null()) return {};
    std::vector<std::string> out;
    if (it->is_string()) {
        out.push_back(it->get<std::string>());
    } else if (it->is_array() && it->size() <= 4 &&
               std::all_of(it->begin(), it->end(), [](const json& v) { return v.is_string(); })) {
        for (const json& v : *it) out.push_back(v.get<std::string>());
    } else {
        bad("stop", "'stop' must be a string or a list of up to 4 strings");
    }
    out.erase(std::remove(out.begin(), out.end(), std::string()), out.end());
    return out;
}

// OpenAI's logit_bias: {"token id": bias in [-100, 100]}.
std::vector<std::pair<int32_t, float>> logit_bias(const json& body, const Tokenizer& tok) {
    const auto it = body.find("logit_bias");
    if (it == body.end() || it->is_null()) return {};
    if (!it->is_object()) bad("logit_bias", "'logit_bias' must be an object of token ids to biases");
    std::vector<std::pair<int32_t, float>> out;
    for (const auto& [key, v] : it->items()) {
        char* end = nullptr;
        const long id = std::strtol(key.c_str(), &end, 10);
        if (key.empty() || *end != '\0' || id < 0 || id >= tok.vocab_size())
            bad("logit_bias",
                fmt::format("'logit_bias' key '{}' is not a token id of this model's vocabulary "
                            "(0 to {})",
                            key, tok.vocab_size() - 1));
        if (!v.is_number() || v.get<double>() < -100.0 || v.get<double>() > 100.0)
            bad("logit_bias",
                fmt::format("'logit_bias' of token {} must be a number from -100 to 100, got {}", key,
                            v.dump()));
        out.emplace_back(int32_t(id), v.get<float>());
    }
    return out;
}

// What OpenAI's API has and this server does not do: refused, naming the field, rather than ignored.
void refuse_unsupported(const json& j) {
    const auto given = [&](const char* name) {
        const auto it = j.find(name);
        return it != j.end() && !it->is_null() && *it != false && *it != 0 && *it != "" &&
               !(it->is_array() && it->empty());
    };
    for (const char* name : {"suffix", "tools", "functions"})
        if (given(name)) bad(name, fmt::format("'{}' is not supported by this server; leave it out", name));
    for (const char* name : {"tool_choice", "function_call"})
        if (given(name) && j[name] != "none" && j[name] != "auto")
            bad(name, fmt::format("'{}': this server calls no tools", name));
    if (given("best_of") && j["best_of"] != 1)
        bad("best_of", "'best_of': this server returns one completion per request (best_of = 1)");
    if (const auto it = j.find("response_format"); it != j.end() && !it->is_null()) {
        if (!it->is_object() || it->value("type", "") != "text")
            bad("response_format", "'response_format': this server writes plain text ({\"type\": \"text\"})");
    }
}

// max_tokens (or max_completion_tokens): OpenAI's defaults (16; a chat: the rest of the context), checked
// against the context with the longest prompt, P tokens
int max_new_tokens(const json& j, Endpoint endpoint, const ServedModel& m, int P, bool echo) {
    int64_t max_tokens = endpoint == Endpoint::Chat ? m.n_ctx - P : 16;
    const char* max_name = j.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    field(j, max_name, max_tokens, is_int, "an integer");
    if (max_tokens < (echo ? 0 : 1))  // with echo, 0 scores the prompt alone
        bad(max_name, fmt::format("'{}' must be at least {}, got {}", max_name, echo ? 0 : 1, max_tokens));
    if (P + max_tokens > m.n_ctx)
        bad(max_name,
            fmt::format("This model's maximum context length is {} tokens. However, you requested {} "
                        "tokens ({} in the prompt, {} for the completion)",
                        m.n_ctx, P + max_tokens, P, max_tokens));
    return int(max_tokens);
}

// The sampling fields, each checked against its range (repetition_penalty and min_p as vLLM's and
// llama.cpp's servers take them), the fields this server refuses, the seed (random_seed where none is given)
// and the stop tokens
void sampling_fields(const json& j, const ServedModel& m, uint64_t random_seed, SampleOptions& s) {
    double temperature = 1.0, top_p = 1.0;
    field(j, "temperature", temperature, is_num, "a number");
    if (temperature < 0.0 || temperature > 2.0)
        bad("temperature", fmt::format("'temperature' must be between 0 and 2, got {}", temperature));
    field(j, "top_p", top_p, is_num, "a number");
    if (top_p <= 0.0 || top_p > 1.0) bad("top_p", fmt::format("'top_p' must be in (0, 1], got {}", top_p));
    s.temperature = float(temperature);
    s.top_p = float(top_p);
    int64_t top_k = 0;
    field(j, "top_k", top_k, is_int, "an integer");
    if (top_k < 0) bad("top_k", fmt::format("'top_k' must be 0 (off) or more, got {}", top_k));
    s.top_k = int(std::min<int64_t>(top_k, m.tok->vocab_size()));
    for (const char* name : {"presence_penalty", "frequency_penalty"}) {
        double v = 0.0;
        field(j, name, v, is_num, "a number");
        if (v < -2.0 || v > 2.0) bad(name, fmt::format("'{}' must be between -2 and 2, got {}", name, v));
        (name[0] == 'p' ? s.presence_penalty : s.frequency_penalty) = float(v);
    }
    double repetition = 1.0, min_p = 0.0;
    field(j, "repetition_penalty", repetition, is_num, "a number");
    if (repetition <= 0.0 || repetition > 10.0)
        bad("repetition_penalty",
            fmt::format("'repetition_penalty' must be in (0, 10] (1 = off), got {}", repetition));
    field(j, "min_p", min_p, is_num, "a number");
    if (min_p < 0.0 || min_p > 1.0)
        bad("min_p", fmt::format("'min_p' must be in [0, 1] (0 = off), got {}", min_p));
    s.repetition_penalty = float(repetition);
    s.min_p = float(min_p);
    s.logit_bias = logit_bias(j, *m.tok);
    refuse_unsupported(j);
    int64_t seed = int64_t(random_seed);
    field(j, "seed", seed, is_int, "an integer");
    s.seed = uint64_t(seed);
    s.stop_tokens = m.stop_tokens;
    s.vocab_real = m.tok->vocab_size();
}

}  // namespace

GenerationRequest parse_request(Endpoint endpoint, const std::string& body, const ServedModel& m,
                                uint64_t random_seed) {
    json j;
    try {
        j = json::parse(body);
    } catch (const json::parse_error& e) {
        throw ApiError(400, fmt::format("the body is not valid JSON: {}", e.what()));
    }
    if (!j.is_object()) throw ApiError(400, "the body must be a JSON object");
    std::string model;
    field(
        j, "model", model, [](const json& v) { return v.is_string(); }, "a string");
    if (!model.empty() && model != m.name)
        throw ApiError(404,
                       fmt::format("The model '{}' does not exist; this server serves '{}'", model, m.name),
                       "model", "invalid_request_error", "model_not_found");
    GenerationRequest r;
    r.endpoint = endpoint;
    field(j, "n", r.n, is_int, "an integer");
    if (r.n < 1) bad("n", fmt::format("'n' is {}; it must be at least 1", r.n));
    if (endpoint == Endpoint::Chat)
        r.prompts = {chat_prompt(j, m)};
    else
        r.prompts = completion_prompts(j, m);
    if (r.n > 1) {  // each prompt n times, a choice each
        if (int64_t(r.prompts.size()) * r.n > m.max_prompts)
            bad("n",
                fmt::format("{} prompt{} with n = {} make {} choices; this server takes at most {} in one "
                            "request (its sequences and queue)",
                            r.prompts.size(), r.prompts.size() == 1 ? "" : "s", r.n,
                            int64_t(r.prompts.size()) * r.n, m.max_prompts));
        std::vector<std::vector<int32_t>> each;
        for (const auto& prompt : r.prompts) each.insert(each.end(), size_t(r.n), prompt);
        r.prompts = std::move(each);
    }
    int P = 0;  // the longest prompt
    for (const auto& prompt : r.prompts) {
        if (prompt.empty()) bad("prompt", "the prompt is empty; give at least one token of text");
        P = std::max(P, int(prompt.size()));
    }
    if (P >= m.n_ctx)
        bad(endpoint == Endpoint::Chat ? "messages" : "prompt",
            fmt::format("This model's maximum context length is {} tokens; the prompt has {} (leave room for "
                        "at least one generated token)",
                        m.n_ctx, P));
    logprob_fields(j, endpoint, r);
    r.sample.max_new_tokens = max_new_tokens(j, endpoint, m, P, r.echo);
    sampling_fields(j, m, random_seed, r.sample);
    r.stop = stop_strings(j);
    field(j, "stream", r.stream, is_bool, "a boolean");
    if (const auto it = j.find("stream_options"); it != j.end() && !it->is_null()) {
        if (!it->is_object()) bad("stream_options", "'stream_options' must be an object");
        field(*it, "include_usage", r.include_usage, is_bool, "a boolean");
    }
    return r;
}

// ---- responses ------------------------------------------------------------------------------------------

namespace {

json head(const ResponseHead& h, bool chunk) {
    const bool chat = h.endpoint == Endpoint::Chat;
    return {{"id", h.id},
            {"object", chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
            {"created", h.created},
            {"model", h.model}};
}

json usage(int prompt_tokens, int completion_tokens) {
    return {{"prompt_tokens", prompt_tokens},
            {"completion_tokens", completion_tokens},
            {"total_tokens", prompt_tokens + completion_tokens}};
}

json finish_json(const char* finish) {
    return finish ? json(finish) : json();
}

}  // namespace

json completion_response(const ResponseHead& h, const std::vector<Choice>& choices, int prompt_tokens,
                         int completion_tokens) {
    json out = head(h, false);
    out["choices"] = json::array();
    for (size_t i = 0; i < choices.size(); i++) {
        const Choice& c = choices[i];
        json choice = {{"index", i}, {"logprobs", c.logprobs}, {"finish_reason", finish_json(c.finish)}};
        if (h.endpoint == Endpoint::Chat)
            choice["message"] = {{"role", "assistant"}, {"content", c.text}};
        else
            choice["text"] = c.text;
        out["choices"].push_back(std::move(choice));
    }
    out["usage"] = usage(prompt_tokens, completion_tokens);
    return out;
}

json stream_chunk(const ResponseHead& h, const std::string& delta, const char* finish, bool first,
                  const json& logprobs, int index) {
    json out = head(h, true);
    json choice = {{"index", index}, {"logprobs", logprobs}, {"finish_reason", finish_json(finish)}};
    if (h.endpoint == Endpoint::Chat) {
        json d = json::object();
        if (first) d["role"] = "assistant";
        if (!delta.empty() || (first && !finish)) d["content"] = delta;
        choice["delta"] = d;
    } else {
        choice["text"] = delta;
    }
    out["choices"] = json::array({choice});
    return out;
}

json usage_chunk(const ResponseHead& h, int prompt_tokens, int completion_tokens) {
    json out = head(h, true);
    out["choices"] = json::array();
    out["usage"] = usage(prompt_tokens, completion_tokens);
    return out;
}

size_t utf8_length(const std::string& s) {
    return size_t(std::count_if(s.begin(), s.end(), [](char c) { return (uint8_t(c) & 0xC0) != 0x80; }));
}

namespace {

json byte_list(const std::string& s) {
    json b = json::array();
    for (const char c : s) b.push_back(int(uint8_t(c)));
    return b;
}

// How logprobs name a token: its text, or "token_id:N".
std::string token_name(const Tokenizer& tok, int32_t id, bool ids) {
    return ids ? fmt::format("token_id:{}", id) : tok.decode(&id, 1);
}

}  // namespace

json completion_logprobs(const Tokenizer& tok, const std::vector<LogprobItem>& items, size_t& offset,
                         bool ids) {
    json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
    for (const LogprobItem& it : items) {
        const std::string text = tok.decode(&it.id, 1), name = token_name(tok, it.id, ids);
        tokens.push_back(name);
        offsets.push_back(offset);
        offset += utf8_length(text);
        if (!it.lp) {
            lps.push_back(nullptr);
            tops.push_back(nullptr);
            continue;
        }
        lps.push_back(it.lp->logprob);
        json top = json::object();
        for (const auto& [id, lp] : it.lp->top) top.emplace(token_name(tok, id, ids), lp);
        top.emplace(name, it.lp->logprob);  // OpenAI lists the token itself too
        tops.push_back(std::move(top));
    }
    return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json chat_logprobs(const Tokenizer& tok, const std::vector<LogprobItem>& items, bool ids) {
    json content = json::array();
    for (const LogprobItem& it : items) {
        if (!it.lp) continue;
        json top = json::array();
        for (const auto& [id, lp] : it.lp->top)
            top.push_back({{"token", token_name(tok, id, ids)},
                           {"logprob", lp},
                           {"bytes", byte_list(tok.decode(&id, 1))}});
        content.push_back({{"token", token_name(tok, it.id, ids)},
                           {"logprob", it.lp->logprob},
                           {"bytes", byte_list(tok.decode(&it.id, 1))},
                           {"top_logprobs", top}});
    }
    return {{"content", content}, {"refusal", nullptr}};
}

json models_list(const ServedModel& m) {
    return {{"object", "list"},
            {"data", json::array({{{"id", m.name},
                                   {"object", "model"},
                                   {"created", m.created},
                                   {"owned_by", "anvil"},
                                   {"context_length", m.n_ctx}}})}};
}

}  // namespace anvil::serve
