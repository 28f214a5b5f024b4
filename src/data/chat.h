// Prompt templates and chat records: how an instruction record or a conversation becomes the tokens a model
// trains on (loss on the assistant's turns only) and the prompt it answers.
//
// Templates (--template / --chat-template, stored in a checkpoint's config.json as anvil_template):
//  alpaca   Stanford Alpaca's prompts. Instruction records: "Below is an instruction that describes a task,
//           paired with an input that provides further context. Write a response that appropriately completes
//           the request.\n\n### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n";
//           without input: "Below is an instruction that describes a task. Write a response that
//           appropriately completes the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n".
//           Chats: the system message (else that second preamble), then per user turn "\n\n###
//           Instruction:\n{user}\n\n### Response:\n"; a one-turn chat renders as the instruction record
//           without input.
//  compact  "{instruction}\n{input}\n=> " (the input line left out when empty); chats: "{system}\n", then
//           "{user}\n=> " per user turn. For small byte-level models, where every prompt byte costs a token.
//  llama3   Meta Llama 3 Instruct: <|begin_of_text|>, then
//  <|start_header_id|>{role}<|end_header_id|>\n\n{content,
//           trimmed}<|eot_id|> per message; the prompt ends with the assistant's header.
//  chatml   <|im_start|>{role}\n{content}<|im_end|>\n per message (Qwen, many fine-tunes); the prompt ends
//           with "<|im_start|>assistant\n". A conversation without a system message opens with the
//           tokenizer's default one where its own chat template has one (Qwen2, Qwen2.5:
//           Tokenizer::default_system), as that template renders it.
//  llama2   Llama 2 Chat, as its tokenizer_config.json's chat_template renders it: per user turn
//           <s>"[INST] {content, trimmed} [/INST]", the first one's content "<<SYS>>\n{system}\n<</SYS>>\n\n
//           {user}" when there is a system message; per assistant turn " {content, trimmed} "</s>. Turns
//           alternate user, assistant, starting with the user's (template_problem says where not); the
//           prompt ends with " [/INST]".
//  mistral  Mistral Instruct's, spaced as the tokenizer's chat_template spells it: <s>, per user turn
//           "[INST] {user} [/INST]" (v1: 7B v0.1, Mixtral) or "[INST]{user}[/INST]" with [INST] and [/INST]
//           control tokens (v3 and Tekken: v0.3, Nemo, Small), per answer "{answer}"</s> (or " {answer}");
//           the system message, where the template takes one, joined with "\n\n" to the first user turn
//           or, in v3 and Tekken (loop.last), to the user turn that ends a prompt (a training record that
//           ends with its answer renders without it, as that template does). Turns alternate as in llama2.
//  zephyr   Zephyr's (TinyLlama-1.1B-Chat, zephyr-7b-beta, TRL's default): per message
//           "<|{role}|>\n{content}"</s>"\n", the markers plain text; the prompt ends with "<|assistant|>\n".
//  auto     llama3 when the tokenizer has Llama 3's header tokens, chatml when it has <|im_start|>, llama2
//           when its chat_template is Llama 2's ([INST] and <<SYS>>), mistral when it is Mistral's ([INST]
//           without <<SYS>>) or the vocabulary has [INST] and [/INST] control tokens, zephyr when it is
//           Zephyr's (<|user|>, <|assistant|> and the EOS after each message), else alpaca.
// An instruction record in a chat template is one user turn ("{instruction}" or "{instruction}\n\n{input}")
// and one assistant turn ("{output}"). An assistant turn ends with the template's end-of-turn token
// (<|eot_id|>, <|im_end|>) or, in alpaca, compact, llama2, mistral and zephyr, the tokenizer's end-of-text;
// the turn and that token are the targets. Special tokens are never read out of message text: "<|eot_id|>"
// typed by a user stays text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/token_view.h"
#include "data/tokenizer.h"

namespace anvil {

enum class Role : uint8_t { System, User, Assistant };
const char* role_name(Role r);
bool parse_role(std::string_view name, Role* out);  // system, user, assistant

struct Message {
    Role role;
    std::string content;
};

// One supervised example: an instruction record, or a chat record (messages; the instruction fields empty).
// The answer is the output, or the content of the last message when it is the assistant's.
struct Example {
    std::string instruction, input, output;
    std::vector<Message> messages;
    bool chat() const { return !messages.empty(); }
    const std::string& answer() const;
    const std::string& question() const;  // instruction, or the last user turn (for reports)
};

// Why a chat cannot be trained on, or "" when it can: roles in order (a system message only first), at least
// one assistant turn, no empty assistant turn.
std::string chat_problem(const std::vector<Message>& messages);

enum class PromptTemplate : uint8_t { Alpaca, Compact, Llama3, ChatML, Llama2, Zephyr, Mistral };
const char* template_name(PromptTemplate t);
// --template NAME (alpaca, compact, llama3, chatml, llama2, mistral, zephyr, auto; empty = auto) for this
// tokenizer.
// Throws naming the flag for an unknown name or a tokenizer without the template's special tokens.
PromptTemplate choose_template(const std::string& name, const Tokenizer& tok);
// Why this template cannot render the record, or "": llama2 and mistral need the turns (after a system
// message) alternating user, assistant, starting with the user's, and a mistral chat_template without a
// system message (v0.1's) takes none. render_spans throws with the same words.
std::string template_problem(const Example& e, PromptTemplate t, const Tokenizer& tok);
// Why the template was chosen, for the one line that says so ("from the tokenizer's special tokens"), and
// the tokenizer's default system message where chatml puts one first.
std::string template_reason(const std::string& name, PromptTemplate t, const Tokenizer& tok);

// A rendered record before tokenization: text pieces and special tokens, each a target or not.
struct ChatSpan {
    bool special = false;  // `id` (a special token) rather than `text`
    bool target = false;
    std::string text;
    int32_t id = -1;
};
// The whole record (prompt_only = false), or the prompt the answer follows: every message but a final
// assistant one, then the assistant's header.
std::vector<ChatSpan> render_spans(const Example& e, PromptTemplate t, const Tokenizer& tok,
                                   bool prompt_only);

// A record as the model trains on it: BOS when the tokenizer adds one (never a target), the rendered turns,
// targets flagged kInLoss | kNeedsPrompt, the first token kRecordStart. Neighbouring text pieces are encoded
// together; a target piece alone (as at generation time, where the prompt ends before it), as the
// continuation of the text before it (Tokenizer::encode_continuation), so that the ids are the whole
// text's where the tokenizer allows it.
TokenStream record_tokens(const Example& e, PromptTemplate t, const Tokenizer& tok);
// The generation prompt: BOS when the tokenizer adds one, then render_spans(prompt_only).
std::vector<int32_t> prompt_tokens(const Example& e, PromptTemplate t, const Tokenizer& tok);
// The same as text, special tokens spelled out but BOS left out (what `generate` shows, what the tests pin).
std::string render_text(const Example& e, PromptTemplate t, const Tokenizer& tok, bool prompt_only);
// Ids that end an answer: the template's end-of-turn token and the tokenizer's end-of-text.
std::vector<int32_t> stop_tokens(PromptTemplate t, const Tokenizer& tok);

// Magpie's pre-query template (Xu et al. 2024): a one-turn prompt cut where the user's words begin, so that a
// model continuing it writes a user turn, and how that turn ends.
struct QueryFrame {
    // BOS (or, for a tokenizer without one, its end-of-text, where a document begins) and the template up
    // to the user's words
    std::vector<int32_t> prefix;
    std::vector<int32_t> stop;  // ids that end the turn: stop_tokens(), and a special token that follows it
    std::string end_text;       // the text that follows it ("\n=> " in compact), where the turn ends too
};
QueryFrame query_frame(PromptTemplate t, const Tokenizer& tok);

}  // namespace anvil
