#include "data/chat.h"

#include <cstring>

#include "core/error.h"
#include "core/text.h"

namespace anvil {

const char* role_name(Role r) {
    return r == Role::System ? "system" : r == Role::User ? "user" : "assistant";
}

bool parse_role(std::string_view name, Role* out) {
    for (Role r : {Role::System, Role::User, Role::Assistant})
        if (name == role_name(r)) {
            *out = r;
            return true;
        }
    return false;
}

const std::string& Example::answer() const {
    if (!chat()) return output;
    static const std::string none;
    return messages.back().role == Role::Assistant ? messages.back().content : none;
}

const std::string& Example::question() const {
    if (!chat()) return instruction;
    for (size_t i = messages.size(); i-- > 0;)
        if (messages[i].role == Role::User) return messages[i].content;
    return messages.front().content;
}

std::string chat_problem(const std::vector<Message>& messages) {
    if (messages.empty()) return "\"messages\" is empty";
    bool assistant = false;
    for (size_t i = 0; i < messages.size(); i++) {
        const Message& m = messages[i];
        if (m.role == Role::System && i > 0)
            return fmt::format("message {}: a system message must come first", i + 1);
        if (m.role == Role::Assistant) {
            if (m.content.find_first_not_of(" \t\r\n") == std::string::npos)
                return fmt::format("message {}: empty assistant turn; nothing to learn from it", i + 1);
            assistant = true;
        }
    }
    return assistant ? "" : "no assistant turn; nothing to learn from this record";
}

const char* template_name(PromptTemplate t) {
    switch (t) {
        case PromptTemplate::Alpaca:
            return "alpaca";
        case PromptTemplate::Compact:
            return "compact";
        case PromptTemplate::Llama3:
            return "llama3";
        case PromptTemplate::ChatML:
            return "chatml";
        case PromptTemplate::Llama2:
            return "llama2";
        case PromptTemplate::Zephyr:
            return "zephyr";
        case PromptTemplate::Mistral:
            return "mistral";
    }
    return "?";
}

namespace {

constexpr const char* kLlama3Specials[] = {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
constexpr const char* kChatmlSpecials[] = {"<|im_start|>", "<|im_end|>"};

template <size_t N>
const char* missing_special(const Tokenizer& tok, const char* const (&names)[N]) {
    for (const char* n : names)
        if (tok.special_id(n) < 0) return n;
    return nullptr;
}

int32_t special(const Tokenizer& tok, const char* text) {
    const int id = tok.special_id(text);
    ANVIL_CHECK(id >= 0, "the tokenizer has no {} special token", text);
    return id;
}

// Llama 2 Chat's chat_template: the only one that wraps user turns in [INST] and the system message in
// <<SYS>> (Mistral's has [INST] without <<SYS>>, and another spacing).
bool llama2_chat_template(const std::string& tmpl) {
    return tmpl.find("[INST]") != std::string::npos && tmpl.find("<<SYS>>") != std::string::npos;
}

// Zephyr's chat_template (TinyLlama-Chat's, zephyr-7b-beta's, TRL's default): <|user|>, <|assistant|> as
// text, each message closed by eos_token; not Phi-3's, which closes them with its own <|end|>.
bool zephyr_chat_template(const std::string& tmpl) {
    for (const char* part : {"<|user|>", "<|assistant|>", "eos_token"})
        if (tmpl.find(part) == std::string::npos) return false;
    return tmpl.find("<|end|>") == std::string::npos;
}

// Mistral Instruct's chat_template: [INST] ... [/INST] without Llama 2's <<SYS>>.
bool mistral_chat_template(const std::string& tmpl) {
    return tmpl.find("[INST]") != std::string::npos && tmpl.find("[/INST]") != std::string::npos &&
           tmpl.find("<<SYS>>") == std::string::npos;
}

// A vocabulary with Mistral's control tokens [INST] and [/INST] (v3 and Tekken tokenizers).
bool mistral_specials(const Tokenizer& tok) {
    return tok.special_id("[INST]") >= 0 && tok.special_id("[/INST]") >= 0;
}

// The string literals of a Jinja template, in order, with their offsets; escapes undone.
struct Literal {
    size_t at;
    std::string text;
};
std::vector<Literal> literals_of(const std::string& t) {
    std::vector<Literal> out;
    bool in_code = false;
    for (size_t i = 0; i + 1 < t.size(); i++) {
        if (!in_code) {
            if (t[i] == '{' && (t[i + 1] == '{' || t[i + 1] == '%')) in_code = true, i++;
            continue;
        }
        if ((t[i] == '}' || t[i] == '%') && t[i + 1] == '}') {
            in_code = false, i++;
            continue;
        }
        if (t[i] != '\'' && t[i] != '"') continue;
        const char q = t[i];
        Literal lit{i, ""};
        for (i++; i < t.size() && t[i] != q; i++) {
            if (t[i] != '\\' || i + 1 == t.size()) {
                lit.text += t[i];
                continue;
            }
            const char e = t[++i];
            lit.text += e == 'n' ? '\n' : e == 't' ? '\t' : e;
        }
        out.push_back(std::move(lit));
    }
    return out;
}

// How a Mistral chat_template spells a conversation, read off its literals: what surrounds a user turn, an
// answer and the system message, and which user turn that joins. The forms Mistral AI has shipped:
//   v1 (7B Instruct v0.1, Mixtral)   '[INST] ' + user + ' [/INST]', answer + eos; no system message
//   v0.2's later template            ' [INST] ' + (system + '\n\n' on the first) + user + ' [/INST]',
//                                    ' ' + answer + eos
//   v3, Tekken (v0.3, Nemo, Small)   "[INST]" (or "[INST] ") + (system + "\n\n" on the last: loop.last)
//                                    + user + "[/INST]", answer (" " + answer|trim in v0.3) + eos, with
//                                    [INST] and [/INST] control tokens
// Without a template to read, the vocabulary decides: v3's spelling with the control tokens, else v1's.
struct MistralStyle {
    std::string open = "[INST] ", close = " [/INST]";
    bool user_trim = false;
    std::string answer_lead, answer_tail;
    bool answer_trim = false;
    enum class System : uint8_t { None, First, Last } system = System::First;
    std::string system_join = "\n\n";
};

MistralStyle read_mistral_style(const Tokenizer& tok) {
    MistralStyle s;
    if (mistral_specials(tok)) s.open = "[INST]", s.close = "[/INST]", s.system = MistralStyle::System::Last;
    const std::string& t = tok.chat_template();
    if (!mistral_chat_template(t)) return s;
    const std::vector<Literal> lits = literals_of(t);
    const auto first_with = [&](const char* needle) -> const Literal* {
        for (const Literal& l : lits)
            if (l.text.find(needle) != std::string::npos) return &l;
        return nullptr;
    };
    const Literal *open = first_with("[INST]"), *close = first_with("[/INST]");
    if (open && close && open->at < close->at) {
        s.open = open->text, s.close = close->text;
        const std::string between = t.substr(open->at, close->at - open->at);
        s.user_trim =
            between.find("strip()") != std::string::npos || between.find("|trim") != std::string::npos;
    }
    // the answer: the output expression that ends with eos_token and holds the message's content
    for (size_t at = t.find("eos_token"); at != std::string::npos; at = t.find("eos_token", at + 1)) {
        const size_t a = t.rfind("{{", at), b = t.find("}}", at);
        if (a == std::string::npos || b == std::string::npos) continue;
        const std::string expr = t.substr(a, b - a);
        const size_t content = expr.find("content");
        if (content == std::string::npos || expr.find("INST]") != std::string::npos) continue;
        s.answer_trim = expr.find("strip()") != std::string::npos || expr.find("|trim") != std::string::npos;
        for (const Literal& l : lits) {
            // a subscript's key (message["content"]) is no text the template writes
            if (l.at < a || l.at > b || t[l.at - 1] == '[') continue;
            (l.at - a < content ? s.answer_lead : s.answer_tail) += l.text;
        }
        break;
    }
    if (t.find("system_message") == std::string::npos) {
        s.system = MistralStyle::System::None;
    } else {
        s.system = t.find("loop.last and system_message") != std::string::npos ? MistralStyle::System::Last
                                                                               : MistralStyle::System::First;
        const size_t join = t.find("system_message +");
        for (const Literal& l : lits)
            if (join != std::string::npos && l.at > join) {
                s.system_join = l.text;
                break;
            }
    }
    return s;
}

// The style of the tokenizer's template, read once per thread and template (render_spans asks per record).
MistralStyle mistral_style(const Tokenizer& tok) {
    thread_local struct {
        std::string tmpl;
        bool specials = false;
        MistralStyle style;
        bool valid = false;
    } last;
    if (!last.valid || last.tmpl != tok.chat_template() || last.specials != mistral_specials(tok)) {
        last.tmpl = tok.chat_template();
        last.specials = mistral_specials(tok);
        last.style = read_mistral_style(tok);
        last.valid = true;
    }
    return last.style;
}

// The <s> that opens each of llama2's user turns: the tokenizer's BOS, else its "<s>" token (-1: none).
int32_t llama2_bos(const Tokenizer& tok) {
    return tok.bos_id() >= 0 ? tok.bos_id() : tok.special_id("<s>");
}

// The conversation a template renders: a chat's messages, or an instruction record as one user and one
// assistant turn.
std::vector<Message> turns_of(const Example& e) {
    if (e.chat()) return e.messages;
    std::string user = e.instruction;
    if (!e.input.empty()) user += "\n\n" + e.input;
    return {{Role::User, user}, {Role::Assistant, e.output}};
}

// How many of the messages a rendering shows: all, or for a prompt all but a final assistant turn (the
// answer).
size_t rendered_turns(const std::vector<Message>& m, bool prompt_only) {
    return prompt_only && m.back().role == Role::Assistant ? m.size() - 1 : m.size();
}

struct SpanWriter {
    std::vector<ChatSpan> spans;
    void text(std::string s, bool target = false) {
        if (!spans.empty() && !spans.back().special && spans.back().target == target)
            spans.back().text += s;
        else
            spans.push_back({false, target, std::move(s), -1});
    }
    void token(int32_t id, bool target = false) { spans.push_back({true, target, {}, id}); }
};

constexpr const char* kAlpacaPreamble =
    "Below is an instruction that describes a task. Write a response that appropriately completes the "
    "request.";
constexpr const char* kAlpacaInputPreamble =
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a "
    "response that appropriately completes the request.";

// alpaca and compact: plain text, answers end with the end-of-text token.
void render_plain(const Example& e, PromptTemplate t, const Tokenizer& tok, bool prompt_only, SpanWriter& w) {
    const bool alpaca = t == PromptTemplate::Alpaca;
    if (!e.chat()) {
        if (!alpaca) {
            w.text(e.instruction + "\n" + (e.input.empty() ? "" : e.input + "\n") + "=> ");
        } else if (e.input.empty()) {
            w.text(std::string(kAlpacaPreamble) + "\n\n### Instruction:\n" + e.instruction +
                   "\n\n### Response:\n");
        } else {
            w.text(std::string(kAlpacaInputPreamble) + "\n\n### Instruction:\n" + e.instruction +
                   "\n\n### Input:\n" + e.input + "\n\n### Response:\n");
        }
        if (prompt_only) return;
        w.text(e.output, true);
        w.token(tok.eot_id(), true);
        return;
    }
    const std::vector<Message>& m = e.messages;
    const size_t n = rendered_turns(m, prompt_only);
    size_t i = 0;
    if (m[0].role == Role::System) {
        w.text(m[0].content + (alpaca ? "" : "\n"));
        i = 1;
    } else if (alpaca) {
        w.text(kAlpacaPreamble);
    }
    for (; i < n; i++) {
        if (m[i].role == Role::Assistant) {
            w.text(m[i].content, true);
            w.token(tok.eot_id(), true);
        } else if (alpaca) {
            w.text("\n\n### Instruction:\n" + m[i].content + "\n\n### Response:\n");
        } else {
            w.text(m[i].content + "\n=> ");
        }
    }
}

void render_llama3(const std::vector<Message>& m, size_t n, bool prompt_only, const Tokenizer& tok,
                   SpanWriter& w) {
    const int32_t sh = special(tok, "<|start_header_id|>"), eh = special(tok, "<|end_header_id|>"),
                  eot = special(tok, "<|eot_id|>");
    // the template starts with <|begin_of_text|> itself (tokens_of adds no second one)
    if (const int bos = tok.special_id("<|begin_of_text|>"); bos >= 0) w.token(bos);
    auto header = [&](Role r) {
        w.token(sh);
        w.text(role_name(r));
        w.token(eh);
        w.text("\n\n");
    };
    for (size_t i = 0; i < n; i++) {
        header(m[i].role);
        const bool target = m[i].role == Role::Assistant;
        w.text(trim(m[i].content), target);
        w.token(eot, target);
    }
    if (prompt_only) header(Role::Assistant);
}

void render_chatml(const std::vector<Message>& m, size_t n, bool prompt_only, const Tokenizer& tok,
                   SpanWriter& w) {
    const int32_t start = special(tok, "<|im_start|>"), end = special(tok, "<|im_end|>");
    if (!tok.default_system().empty() && (m.empty() || m[0].role != Role::System)) {
        // the tokenizer's own template opens every conversation with a system message (Qwen's)
        w.token(start);
        w.text("system\n" + tok.default_system());
        w.token(end);
        w.text("\n");
    }
    for (size_t i = 0; i < n; i++) {
        w.token(start);
        w.text(std::string(role_name(m[i].role)) + "\n");
        const bool target = m[i].role == Role::Assistant;
        w.text(m[i].content, target);
        w.token(end, target);
        w.text("\n");
    }
    if (prompt_only) {
        w.token(start);
        w.text("assistant\n");
    }
}

// Llama 2 Chat: <s>[INST] {user} [/INST] {assistant} </s> per exchange, the system message inside the first
// user turn; the answer's leading space belongs to the answer, as the template writes it.
void render_llama2(const std::vector<Message>& m, size_t n, const Tokenizer& tok, SpanWriter& w) {
    const int32_t bos = llama2_bos(tok);
    ANVIL_CHECK(bos >= 0, "the llama2 template needs a beginning-of-sequence token (<s>)");
    const bool system = !m.empty() && m[0].role == Role::System;
    for (size_t i = system ? 1 : 0; i < n; i++) {
        if (m[i].role == Role::Assistant) {
            w.text(" " + trim(m[i].content) + " ", true);
            w.token(tok.eot_id(), true);
            continue;
        }
        const std::string content =
            system && i == 1 ? "<<SYS>>\n" + m[0].content + "\n<</SYS>>\n\n" + m[i].content : m[i].content;
        w.token(bos);
        w.text("[INST] " + trim(content) + " [/INST]");
    }
}

// Mistral Instruct: <s>, then per user turn {open}{user}{close} ([INST] and [/INST] as control tokens where
// the vocabulary has them), per answer {lead}{answer}{tail}</s>; the system message, where the template takes
// one, joined to the first user turn or, as v3 and Tekken do (loop.last), to the user turn that ends the
// rendered conversation: a prompt's, never a record's that ends with its answer.
void render_mistral(const std::vector<Message>& m, size_t n, const Tokenizer& tok, SpanWriter& w) {
    const MistralStyle s = mistral_style(tok);
    const auto literal = [&](const std::string& text) {  // [INST], [/INST] as the vocabulary has them
        for (const char* mark : {"[INST]", "[/INST]"}) {
            const size_t at = text.find(mark);
            const int id = tok.special_id(mark);
            if (at == std::string::npos || id < 0) continue;
            w.text(text.substr(0, at));
            w.token(id);
            w.text(text.substr(at + std::strlen(mark)));
            return;
        }
        w.text(text);
    };
    if (const int32_t bos = llama2_bos(tok); bos >= 0) w.token(bos);
    const bool system = !m.empty() && m[0].role == Role::System;
    const size_t first = system ? 1 : 0;
    for (size_t i = first; i < n; i++) {
        if (m[i].role == Role::Assistant) {
            w.text(s.answer_lead + (s.answer_trim ? trim(m[i].content) : m[i].content) + s.answer_tail, true);
            w.token(tok.eot_id(), true);
            continue;
        }
        std::string content = s.user_trim ? trim(m[i].content) : m[i].content;
        const bool joins = system && ((s.system == MistralStyle::System::First && i == first) ||
                                      (s.system == MistralStyle::System::Last && i + 1 == n));
        if (joins) content = m[0].content + s.system_join + content;
        literal(s.open);
        w.text(content);
        literal(s.close);
    }
}

// Zephyr: <|{role}|>\n{content}</s>\n per message, the prompt ending with <|assistant|>\n.
void render_zephyr(const std::vector<Message>& m, size_t n, bool prompt_only, const Tokenizer& tok,
                   SpanWriter& w) {
    for (size_t i = 0; i < n; i++) {
        w.text("<|" + std::string(role_name(m[i].role)) + "|>\n");
        const bool target = m[i].role == Role::Assistant;
        w.text(m[i].content, target);
        w.token(tok.eot_id(), target);
        w.text("\n");
    }
    if (prompt_only) w.text("<|assistant|>\n");
}

}  // namespace

std::string template_problem(const Example& e, PromptTemplate t, const Tokenizer& tok) {
    if ((t != PromptTemplate::Llama2 && t != PromptTemplate::Mistral) || !e.chat()) return "";
    const std::vector<Message>& m = e.messages;
    const size_t first = m[0].role == Role::System ? 1 : 0;
    if (first && t == PromptTemplate::Mistral && mistral_style(tok).system == MistralStyle::System::None)
        return "message 1: this tokenizer's mistral chat_template takes no system message (Mistral 7B "
               "Instruct "
               "v0.1's raises on one); fold it into the first user turn or drop it";
    for (size_t i = first; i < m.size(); i++) {
        const Role want = (i - first) % 2 == 0 ? Role::User : Role::Assistant;
        if (m[i].role != want)
            return fmt::format(
                "message {}: the {} template needs user and assistant turns alternating, starting "
                "with the user's, but this one is the {}'s where the {}'s belongs; merge or reorder the "
                "turns, or use another --template",
                i + 1, template_name(t), role_name(m[i].role), role_name(want));
    }
    return "";
}

PromptTemplate choose_template(const std::string& name, const Tokenizer& tok) {
    if (name.empty() || name == "auto") {
        if (!missing_special(tok, kLlama3Specials)) return PromptTemplate::Llama3;
        if (!missing_special(tok, kChatmlSpecials)) return PromptTemplate::ChatML;
        if (llama2_chat_template(tok.chat_template()) && llama2_bos(tok) >= 0) return PromptTemplate::Llama2;
        if (mistral_chat_template(tok.chat_template()) || mistral_specials(tok))
            return PromptTemplate::Mistral;
        if (zephyr_chat_template(tok.chat_template())) return PromptTemplate::Zephyr;
        return PromptTemplate::Alpaca;
    }
    if (name == "alpaca") return PromptTemplate::Alpaca;
    if (name == "compact") return PromptTemplate::Compact;
    if (name == "zephyr") return PromptTemplate::Zephyr;    // plain-text markers: any tokenizer
    if (name == "mistral") return PromptTemplate::Mistral;  // [INST] as text where it is no control token
    const char* missing = nullptr;
    PromptTemplate t;
    if (name == "llama3") {
        t = PromptTemplate::Llama3;
        missing = missing_special(tok, kLlama3Specials);
    } else if (name == "chatml") {
        t = PromptTemplate::ChatML;
        missing = missing_special(tok, kChatmlSpecials);
    } else if (name == "llama2") {
        t = PromptTemplate::Llama2;
        if (llama2_bos(tok) < 0) missing = "<s>";
    } else {
        fail(
            "--template {}: unknown template; use auto, alpaca, compact, llama3, chatml, llama2, mistral or "
            "zephyr",
            name);
    }
    ANVIL_CHECK(
        !missing,
        "--template {}: the tokenizer ({}) has no {} special token; {} needs a tokenizer.json that defines "
        "it (Llama 3's for llama3, Qwen's or a ChatML fine-tune's for chatml, Llama 2's for llama2), or use "
        "alpaca or compact",
        name, tok.kind(), missing, name);
    return t;
}

std::string template_reason(const std::string& name, PromptTemplate t, const Tokenizer& tok) {
    std::string why =
        !name.empty() && name != "auto" ? "as --template asks"
        : t == PromptTemplate::Alpaca
            ? "the tokenizer has no chat special tokens and no chat_template anvil renders"
        : t == PromptTemplate::Llama2  ? "the tokenizer's chat_template is Llama 2's ([INST], <<SYS>>)"
        : t == PromptTemplate::Zephyr  ? "the tokenizer's chat_template is Zephyr's (<|user|>, <|assistant|>)"
        : t == PromptTemplate::Mistral ? (mistral_chat_template(tok.chat_template())
                                              ? "the tokenizer's chat_template is Mistral Instruct's ([INST] "
                                                "without <<SYS>>)"
                                              : "the tokenizer has Mistral's [INST] control tokens")
                                       : "from the tokenizer's special tokens";
    if (t == PromptTemplate::Mistral) {
        const MistralStyle s = mistral_style(tok);
        why += fmt::format("; a user turn is \"{}...{}\"", s.open, s.close);
        if (s.system == MistralStyle::System::None) why += ", no system message";
        if (s.system == MistralStyle::System::Last)
            why +=
                "; as that template does, a system message joins only the user turn that ends a prompt, so "
                "a training conversation, which ends with its answer, renders without it";
    }
    if (t == PromptTemplate::ChatML && !tok.default_system().empty())
        why += "; a conversation without a system message opens with its chat template's: \"" +
               tok.default_system() + "\"";
    return why;
}

std::vector<ChatSpan> render_spans(const Example& e, PromptTemplate t, const Tokenizer& tok,
                                   bool prompt_only) {
    SpanWriter w;
    if (t == PromptTemplate::Alpaca || t == PromptTemplate::Compact) {
        render_plain(e, t, tok, prompt_only, w);
        return std::move(w.spans);
    }
    const std::vector<Message> m = turns_of(e);
    const size_t n = rendered_turns(m, prompt_only);
    if (t == PromptTemplate::Llama3) {
        render_llama3(m, n, prompt_only, tok, w);
    } else if (t == PromptTemplate::ChatML) {
        render_chatml(m, n, prompt_only, tok, w);
    } else if (t == PromptTemplate::Zephyr) {
        render_zephyr(m, n, prompt_only, tok, w);
    } else {
        if (const std::string why = template_problem(e, t, tok); !why.empty()) fail("{}", why);
        if (t == PromptTemplate::Llama2)
            render_llama2(m, n, tok, w);
        else
            render_mistral(m, n, tok, w);
    }
    return std::move(w.spans);
}

namespace {
TokenStream tokens_of(const std::vector<ChatSpan>& spans, const Tokenizer& tok) {
    TokenStream s;
    const bool bos_rendered = !spans.empty() && spans[0].special && spans[0].id == tok.bos_id();
    if (tok.bos_id() >= 0 && !bos_rendered)
        s.append_one(tok.bos_id(), 0);  // never a target: nothing predicts it
    // what the piece follows in the rendered text (a BOS added above is the tokenizer's, outside the text)
    enum { Start, AfterSpecial, AfterText } at = Start;
    for (const ChatSpan& c : spans) {
        const uint8_t flag = c.target ? uint8_t(kInLoss | kNeedsPrompt) : uint8_t(0);
        if (c.special) {
            s.append_one(c.id, flag);
            at = AfterSpecial;
        } else if (!c.text.empty()) {
            s.append(at == Start ? tok.encode(c.text) : tok.encode_continuation(c.text, at == AfterSpecial),
                     flag);
            at = AfterText;
        }
    }
    if (s.size()) s.flags[0] |= kRecordStart;
    return s;
}
}  // namespace

TokenStream record_tokens(const Example& e, PromptTemplate t, const Tokenizer& tok) {
    return tokens_of(render_spans(e, t, tok, false), tok);
}

std::vector<int32_t> prompt_tokens(const Example& e, PromptTemplate t, const Tokenizer& tok) {
    return tokens_of(render_spans(e, t, tok, true), tok).ids;
}

std::string render_text(const Example& e, PromptTemplate t, const Tokenizer& tok, bool prompt_only) {
    std::string s;
    const std::vector<ChatSpan> spans = render_spans(e, t, tok, prompt_only);
    for (size_t i = 0; i < spans.size(); i++) {
        const ChatSpan& c = spans[i];
        const bool own_bos =
            t == PromptTemplate::Llama2 || t == PromptTemplate::Mistral;  // <s> without a BOS
        if (i == 0 && c.special && c.id == (own_bos ? llama2_bos(tok) : tok.bos_id())) continue;
        s += c.special ? tok.decode(&c.id, 1) : c.text;
    }
    return s;
}

std::vector<int32_t> stop_tokens(PromptTemplate t, const Tokenizer& tok) {
    std::vector<int32_t> ids;
    if (t == PromptTemplate::Llama3) ids.push_back(special(tok, "<|eot_id|>"));
    if (t == PromptTemplate::ChatML) ids.push_back(special(tok, "<|im_end|>"));
    if (ids.empty() || ids[0] != tok.eot_id()) ids.push_back(tok.eot_id());
    return ids;
}

QueryFrame query_frame(PromptTemplate t, const Tokenizer& tok) {
    static const std::string kMark = "\x01user\x01";  // no template writes it
    Example e;
    e.instruction = kMark;
    const std::vector<ChatSpan> spans = render_spans(e, t, tok, true);
    std::vector<ChatSpan> before;
    QueryFrame f;
    f.stop = stop_tokens(t, tok);
    size_t i = 0;
    for (; i < spans.size(); i++) {
        const size_t at = spans[i].special ? std::string::npos : spans[i].text.find(kMark);
        if (at == std::string::npos) {
            before.push_back(spans[i]);
            continue;
        }
        if (at > 0) before.push_back({false, false, spans[i].text.substr(0, at), -1});
        f.end_text = spans[i].text.substr(at + kMark.size());
        break;
    }
    ANVIL_ASSERT(i < spans.size());
    if (f.end_text.empty() && i + 1 < spans.size() && spans[i + 1].special)
        f.stop.push_back(spans[i + 1].id);
    else if (f.end_text.empty() && i + 1 < spans.size())
        f.end_text = spans[i + 1].text;
    f.prefix = tokens_of(before, tok).ids;
    if (f.prefix.empty()) f.prefix.push_back(tok.eot_id());
    return f;
}

}  // namespace anvil
