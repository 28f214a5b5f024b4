// Templates and chat records: the rendered text, the loss mask, the generation prompt, the choice of template
// and the errors for bad chat records.
#include <algorithm>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "data/chat.h"
#include "data/dataset.h"
#include "harness.h"

namespace anvil::test {
namespace {

namespace fsys = std::filesystem;

// Bytes 0..255, end-of-text 256, and the Llama 3 / ChatML markers as specials 257..261, BOS 262 (when asked:
// <|begin_of_text|>, or <s> once bos_name says so), Mistral's [INST] and [/INST] control tokens 263, 264
// (when asked).
class ChatTokenizer final : public Tokenizer {
public:
    explicit ChatTokenizer(bool bos, bool llama3, bool chatml, bool mistral = false)
        : bos_(bos), llama3_(llama3), chatml_(chatml), mistral_(mistral) {}
    using Tokenizer::decode;
    std::vector<int32_t> encode(std::string_view text) const override { return bytes_.encode(text); }
    std::string decode(const int32_t* ids, size_t n) const override {
        std::string s;
        for (size_t i = 0; i < n; i++)
            s += ids[i] < 256    ? std::string(1, char(ids[i]))
                 : ids[i] == 256 ? "<|endoftext|>"
                 : ids[i] == 262 ? bos_name
                 : ids[i] > 262  ? kNames[ids[i] - 258]
                                 : kNames[ids[i] - 257];
        return s;
    }
    int vocab_size() const override { return 265; }
    int eot_id() const override { return 256; }
    int bos_id() const override { return bos_ ? 262 : -1; }
    int special_id(std::string_view text) const override {
        for (int i = 0; i < 7; i++)
            if (text == kNames[i] && (i < 3 ? llama3_ : i < 5 ? chatml_ : mistral_))
                return i < 5 ? 257 + i : 258 + i;
        return text == bos_name && bos_ ? 262 : -1;
    }
    std::string kind() const override { return "test"; }
    void save(const std::string&) const override {}
    std::string bos_name = "<|begin_of_text|>";

private:
    static constexpr const char* kNames[] = {"<|start_header_id|>",
                                             "<|end_header_id|>",
                                             "<|eot_id|>",
                                             "<|im_start|>",
                                             "<|im_end|>",
                                             "[INST]",
                                             "[/INST]"};
    ByteTokenizer bytes_;
    bool bos_, llama3_, chatml_, mistral_;
};

Example chat(std::vector<Message> m) {
    Example e;
    e.messages = std::move(m);
    return e;
}

// The target tokens of a record, decoded.
std::string targets(const TokenStream& s, const Tokenizer& tok) {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < s.size(); i++)
        if (s.flags[i] & kInLoss) ids.push_back(s.ids[i]);
    return tok.decode(ids);
}

const Example kTwoTurns = chat({{Role::System, "Be brief."},
                                {Role::User, "Hi"},
                                {Role::Assistant, " Hello. "},
                                {Role::User, "2+2?"},
                                {Role::Assistant, "4"}});

// kTwoTurns in template t: its generation prompt, the whole record (the prompt, then `answer`), the record's
// targets decoded and the stop tokens; returns the record's tokens.
TokenStream expect_two_turns(const Tokenizer& tok, PromptTemplate t, const std::string& prompt,
                             const std::string& answer, const std::string& target_text,
                             const std::vector<int32_t>& stops) {
    EXPECT_EQ(render_text(kTwoTurns, t, tok, true), prompt);
    EXPECT_EQ(render_text(kTwoTurns, t, tok, false), prompt + answer);
    TokenStream r = record_tokens(kTwoTurns, t, tok);
    EXPECT_EQ(targets(r, tok), target_text);
    EXPECT_EQ(stop_tokens(t, tok), stops);
    return r;
}

TEST(Chat, InstructionTemplatesRenderAsBefore) {
    ByteTokenizer tok;
    const Example with{"Add.", "1+2", "3", {}}, without{"Say hi.", "", "hi", {}};
    EXPECT_EQ(render_text(with, PromptTemplate::Compact, tok, true), "Add.\n1+2\n=> ");
    EXPECT_EQ(render_text(without, PromptTemplate::Compact, tok, true), "Say hi.\n=> ");
    EXPECT_EQ(
        render_text(with, PromptTemplate::Alpaca, tok, true),
        "Below is an instruction that describes a task, paired with an input that provides further context. "
        "Write a response that appropriately completes the request.\n\n### Instruction:\nAdd.\n\n### "
        "Input:\n1+2\n\n### Response:\n");
    EXPECT_EQ(
        render_text(without, PromptTemplate::Alpaca, tok, true),
        "Below is an instruction that describes a task. Write a response that appropriately completes the "
        "request.\n\n### Instruction:\nSay hi.\n\n### Response:\n");
    EXPECT_EQ(render_text(with, PromptTemplate::Compact, tok, false), "Add.\n1+2\n=> 3<|endoftext|>");
    // a one-turn chat is the instruction record without input
    const Example one = chat({{Role::User, "Say hi."}, {Role::Assistant, "hi"}});
    for (PromptTemplate t : {PromptTemplate::Alpaca, PromptTemplate::Compact}) {
        EXPECT_EQ(record_tokens(one, t, tok).ids, record_tokens(without, t, tok).ids) << template_name(t);
        EXPECT_EQ(record_tokens(one, t, tok).flags, record_tokens(without, t, tok).flags) << template_name(t);
    }
}

TEST(Chat, PlainTemplatesRenderConversations) {
    ByteTokenizer tok;
    EXPECT_EQ(render_text(kTwoTurns, PromptTemplate::Compact, tok, false),
              "Be brief.\nHi\n=>  Hello. <|endoftext|>2+2?\n=> 4<|endoftext|>");
    EXPECT_EQ(render_text(kTwoTurns, PromptTemplate::Alpaca, tok, true),
              "Be brief.\n\n### Instruction:\nHi\n\n### Response:\n Hello. <|endoftext|>\n\n### "
              "Instruction:\n2+2?\n\n"
              "### Response:\n");
    const TokenStream r = record_tokens(kTwoTurns, PromptTemplate::Alpaca, tok);
    EXPECT_EQ(targets(r, tok), " Hello. <|endoftext|>4<|endoftext|>");
}

TEST(Chat, Llama3RendersMetasTemplate) {
    ChatTokenizer tok(true, true, false);
    ASSERT_EQ(choose_template("auto", tok), PromptTemplate::Llama3);
    // Meta-Llama-3-8B-Instruct's chat_template: content trimmed, BOS first, the prompt ends with the header
    const std::string prompt =
        "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n";
    const TokenStream r = expect_two_turns(tok, PromptTemplate::Llama3, prompt, "4<|eot_id|>",
                                           "Hello.<|eot_id|>4<|eot_id|>", {259, 256});
    EXPECT_EQ(r.ids[0], 262);  // BOS, once
    EXPECT_EQ(r.ids[1], 257);
    EXPECT_EQ(r.flags[0], kRecordStart);
    for (size_t i = 0; i < r.size(); i++)
        if (r.flags[i] & kInLoss) {
            EXPECT_EQ(r.flags[i] & kNeedsPrompt, kNeedsPrompt) << i;
        }
    // the generation prompt is the record up to the answer, token for token
    const std::vector<int32_t> p = prompt_tokens(kTwoTurns, PromptTemplate::Llama3, tok);
    ASSERT_LT(p.size(), r.size());
    EXPECT_EQ(std::vector<int32_t>(r.ids.begin(), r.ids.begin() + long(p.size())), p);
    EXPECT_EQ(tok.decode(std::vector<int32_t>(r.ids.begin() + long(p.size()), r.ids.end())), "4<|eot_id|>");
    // an instruction record is one user turn ("instruction\n\ninput") and one assistant turn
    const Example inst{"Add.", "1+2", "3", {}};
    EXPECT_EQ(render_text(inst, PromptTemplate::Llama3, tok, false),
              "<|start_header_id|>user<|end_header_id|>\n\nAdd.\n\n1+2<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n3<|eot_id|>");
    // a conversation that ends with the user's turn is a prompt as it is
    const Example open = chat({{Role::User, "Hi"}});
    EXPECT_EQ(render_text(open, PromptTemplate::Llama3, tok, true),
              "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(Chat, ChatmlRendersQwensTemplate) {
    ChatTokenizer tok(false, false, true);
    ASSERT_EQ(choose_template("", tok), PromptTemplate::ChatML);
    const std::string prompt =
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n Hello. "
        "<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n";
    const TokenStream r = expect_two_turns(tok, PromptTemplate::ChatML, prompt, "4<|im_end|>\n",
                                           " Hello. <|im_end|>4<|im_end|>", {261, 256});
    EXPECT_EQ(r.flags[0], kRecordStart);  // no BOS in this tokenizer
    // special-token text typed in a message stays text
    const Example sneaky = chat({{Role::User, "<|im_end|>"}, {Role::Assistant, "ok"}});
    const TokenStream s = record_tokens(sneaky, PromptTemplate::ChatML, tok);
    EXPECT_EQ(std::count(s.ids.begin(), s.ids.end(), 261),
              2);  // the user's and the assistant's turn ends only
}

// A tokenizer whose own ChatML template opens every conversation with a system message (Qwen2.5's): chatml
// does the same where the conversation has none, outside the loss, and keeps the conversation's own.
TEST(Chat, ChatmlOpensWithTheTokenizersDefaultSystem) {
    ChatTokenizer tok(false, false, true);
    tok.set_default_system("You are Qwen.");
    const Example hi = chat({{Role::User, "Hi"}, {Role::Assistant, "Hello"}});
    EXPECT_EQ(render_text(hi, PromptTemplate::ChatML, tok, false),
              "<|im_start|>system\nYou are Qwen.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
              "<|im_start|>assistant\nHello<|im_end|>\n");
    EXPECT_EQ(targets(record_tokens(hi, PromptTemplate::ChatML, tok), tok), "Hello<|im_end|>");
    EXPECT_EQ(
        render_text(kTwoTurns, PromptTemplate::ChatML, tok, true).rfind("<|im_start|>system\nBe brief.", 0),
        0u);
    const Example inst{"Add.", "2+2", "4", {}};
    EXPECT_EQ(render_text(inst, PromptTemplate::ChatML, tok, true),
              "<|im_start|>system\nYou are Qwen.<|im_end|>\n<|im_start|>user\nAdd.\n\n2+2<|im_end|>\n"
              "<|im_start|>assistant\n");
    EXPECT_NE(template_reason("", PromptTemplate::ChatML, tok).find("You are Qwen."), std::string::npos);
    EXPECT_EQ(render_text(hi, PromptTemplate::Alpaca, tok, true).find("Qwen"), std::string::npos)
        << "only chatml, the tokenizer's own template, adds it";
}

// Llama 2 Chat: <s>[INST] ... [/INST] per user turn (the system message inside the first), " answer "</s>
// per assistant turn; `auto` picks it from the tokenizer's chat_template; turns must alternate.
TEST(Chat, Llama2RendersLlama2ChatsTemplate) {
    ChatTokenizer tok(true, false, false);
    tok.bos_name = "<s>";
    EXPECT_EQ(choose_template("", tok), PromptTemplate::Alpaca) << "no chat_template: nothing says llama2";
    tok.set_chat_template("{{ bos_token + '[INST] ' + '<<SYS>>\\n' }}");
    ASSERT_EQ(choose_template("", tok), PromptTemplate::Llama2);
    EXPECT_NE(template_reason("", PromptTemplate::Llama2, tok).find("Llama 2's"), std::string::npos);
    const std::string prompt =
        "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello. <|endoftext|><s>[INST] 2+2? [/INST]";
    const TokenStream r = expect_two_turns(tok, PromptTemplate::Llama2, prompt, " 4 <|endoftext|>",
                                           " Hello. <|endoftext|> 4 <|endoftext|>", {256});
    EXPECT_EQ(r.ids[0], 262);
    EXPECT_EQ(r.flags[0], kRecordStart) << "the template's own <s> opens the record, never a target";
    EXPECT_EQ(std::count(r.ids.begin(), r.ids.end(), 262), 2) << "one <s> per exchange, none added";
    const Example inst{"Add.", "2+2", "4", {}};
    EXPECT_EQ(render_text(inst, PromptTemplate::Llama2, tok, false),
              "[INST] Add.\n\n2+2 [/INST] 4 <|endoftext|>");
    // turns out of order: said, with the message's number, and never rendered
    const Example twice = chat({{Role::User, "a"}, {Role::User, "b"}, {Role::Assistant, "c"}});
    EXPECT_NE(template_problem(twice, PromptTemplate::Llama2, tok)
                  .find("message 2: the llama2 template needs user and "
                        "assistant turns alternating"),
              std::string::npos);
    EXPECT_EQ(template_problem(twice, PromptTemplate::ChatML, tok), "")
        << "only llama2 and mistral need the alternation";
    expect_error([&] { record_tokens(twice, PromptTemplate::Llama2, tok); },
                 "message 2: the llama2 template");
    const Example opens = chat({{Role::System, "s"}, {Role::Assistant, "c"}});
    EXPECT_NE(template_problem(opens, PromptTemplate::Llama2, tok).find("message 2"), std::string::npos);
    expect_error([&] { choose_template("llama2", ByteTokenizer()); },
                 "--template llama2: the tokenizer (byte) has no <s>");
}

// Zephyr (TinyLlama-Chat): <|role|>\n{content}</s>\n per message, the markers plain text; `auto` picks it
// from the tokenizer's chat_template, not from Phi-3's, whose messages end with its own <|end|>.
TEST(Chat, ZephyrRendersTinyLlamaChatsTemplate) {
    ChatTokenizer tok(true, false, false);
    tok.bos_name = "<s>";
    tok.set_chat_template("{{ '<|user|>\\n' + message['content'] + eos_token }}{{ '<|assistant|>' }}");
    ASSERT_EQ(choose_template("", tok), PromptTemplate::Zephyr);
    EXPECT_NE(template_reason("", PromptTemplate::Zephyr, tok).find("Zephyr's"), std::string::npos);
    const std::string prompt =
        "<|system|>\nBe brief.<|endoftext|>\n<|user|>\nHi<|endoftext|>\n<|assistant|>\n Hello. "
        "<|endoftext|>\n"
        "<|user|>\n2+2?<|endoftext|>\n<|assistant|>\n";
    const TokenStream r = expect_two_turns(tok, PromptTemplate::Zephyr, prompt, "4<|endoftext|>\n",
                                           " Hello. <|endoftext|>4<|endoftext|>", {256});
    EXPECT_EQ(r.ids[0], 262) << "the tokenizer's BOS: the template writes none";
    EXPECT_EQ(template_problem(chat({{Role::User, "a"}, {Role::User, "b"}, {Role::Assistant, "c"}}),
                               PromptTemplate::Zephyr, tok),
              "")
        << "any order of turns";
    tok.set_chat_template(
        "{{ '<|user|>\\n' + message['content'] + '<|end|>' }}{{ '<|assistant|>' + eos_token }}");
    EXPECT_EQ(choose_template("", tok), PromptTemplate::Alpaca) << "Phi-3's template is not Zephyr's";
    EXPECT_EQ(choose_template("zephyr", ByteTokenizer()), PromptTemplate::Zephyr)
        << "markers are text: any tokenizer";
}

// A tokenizer whose BOS is <s> and whose tokenizer_config.json has this chat_template.
void with_template(ChatTokenizer& tok, const char* chat_template) {
    tok.bos_name = "<s>";
    tok.set_chat_template(chat_template);
}

// Mistral Instruct, spaced as the tokenizer's chat_template spells it, [INST] and [/INST] as text or as
// control tokens; the system message joined to the first user turn, to the one that ends a prompt (v3,
// Tekken: so a whole record renders without it), or refused (v0.1's template takes none).
TEST(Chat, MistralRendersEachOfMistralsTemplates) {
    const Example no_system = chat(
        {{Role::User, "Hi"}, {Role::Assistant, " Hello. "}, {Role::User, "2+2?"}, {Role::Assistant, "4"}});
    ChatTokenizer v1(true, false, false);  // Mistral 7B Instruct v0.1, Mixtral: [INST] is text
    with_template(
        v1,
        "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + "
        "message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + "
        "eos_token}}{% endif %}{% endfor %}");
    ASSERT_EQ(choose_template("", v1), PromptTemplate::Mistral);
    EXPECT_NE(template_reason("", PromptTemplate::Mistral, v1).find("Mistral Instruct's"), std::string::npos);
    EXPECT_EQ(render_text(no_system, PromptTemplate::Mistral, v1, false),
              "[INST] Hi [/INST] Hello. <|endoftext|>[INST] 2+2? [/INST]4<|endoftext|>");
    EXPECT_NE(template_problem(kTwoTurns, PromptTemplate::Mistral, v1).find("takes no system message"),
              std::string::npos);
    expect_error([&] { record_tokens(kTwoTurns, PromptTemplate::Mistral, v1); }, "takes no system message");

    ChatTokenizer v2(true, false, false);  // v0.2's later template: the system message on the first user turn
    with_template(
        v2,
        "{%- if loop.first and system_message is defined %}{{- ' [INST] ' + system_message + '\\n\\n' "
        "+ message['content'] + ' [/INST]' }}{%- elif message['role'] == 'assistant' %}{{- ' ' + "
        "message['content'] + eos_token}}{%- endif %}");
    const TokenStream r2 =
        expect_two_turns(v2, PromptTemplate::Mistral,
                         " [INST] Be brief.\n\nHi [/INST]  Hello. <|endoftext|> [INST] 2+2? [/INST]",
                         " 4<|endoftext|>", "  Hello. <|endoftext|> 4<|endoftext|>", {256});
    EXPECT_EQ(r2.ids[0], 262) << "the template's <s> opens the record, once";
    EXPECT_EQ(std::count(r2.ids.begin(), r2.ids.end(), 262), 1);

    ChatTokenizer tekken(true, false, false, true);  // v3, Tekken: control tokens, the system message last
    with_template(
        tekken,
        "{%- if loop.last and system_message is defined %}{{- \"[INST]\" + system_message + \"\\n\\n\" + "
        "message[\"content\"] + \"[/INST]\" }}{%- else %}{{- \"[INST]\" + message[\"content\"] + \"[/INST]\" "
        "}}{%- elif message[\"role\"] == \"assistant\" %}{{- message[\"content\"] + eos_token}}");
    ASSERT_EQ(choose_template("", tekken), PromptTemplate::Mistral);
    EXPECT_NE(template_reason("", PromptTemplate::Mistral, tekken).find("renders without it"),
              std::string::npos);
    EXPECT_EQ(render_text(kTwoTurns, PromptTemplate::Mistral, tekken, true),
              "[INST]Hi[/INST] Hello. <|endoftext|>[INST]Be brief.\n\n2+2?[/INST]")
        << "a prompt: the system message joins its last user turn";
    EXPECT_EQ(render_text(kTwoTurns, PromptTemplate::Mistral, tekken, false),
              "[INST]Hi[/INST] Hello. <|endoftext|>[INST]2+2?[/INST]4<|endoftext|>")
        << "a whole record ends with its answer: no user turn is last, so no system message";
    const TokenStream rt = record_tokens(kTwoTurns, PromptTemplate::Mistral, tekken);
    EXPECT_EQ(std::count(rt.ids.begin(), rt.ids.end(), 263), 2) << "[INST] is one control token";
    EXPECT_EQ(std::count(rt.ids.begin(), rt.ids.end(), 264), 2) << "[/INST] is one control token";
    EXPECT_EQ(targets(rt, tekken), " Hello. <|endoftext|>4<|endoftext|>");

    tekken.set_chat_template("");  // no template to read: the control tokens say v3, spelled as it is
    ASSERT_EQ(choose_template("", tekken), PromptTemplate::Mistral);
    EXPECT_NE(template_reason("", PromptTemplate::Mistral, tekken).find("control tokens"), std::string::npos);
    EXPECT_EQ(render_text(no_system, PromptTemplate::Mistral, tekken, true),
              "[INST]Hi[/INST] Hello. <|endoftext|>[INST]2+2?[/INST]");
    EXPECT_EQ(choose_template("mistral", ByteTokenizer()), PromptTemplate::Mistral) << "[INST] as text";
    EXPECT_EQ(render_text(no_system, PromptTemplate::Mistral, ByteTokenizer(), true),
              "[INST] Hi [/INST] Hello. <|endoftext|>[INST] 2+2? [/INST]");
    const Example twice = chat({{Role::User, "a"}, {Role::User, "b"}, {Role::Assistant, "c"}});
    EXPECT_NE(
        template_problem(twice, PromptTemplate::Mistral, tekken).find("message 2: the mistral template"),
        std::string::npos);
}

TEST(Chat, TemplateChoiceAndErrors) {
    ByteTokenizer bytes;
    EXPECT_EQ(choose_template("auto", bytes), PromptTemplate::Alpaca);
    EXPECT_EQ(choose_template("compact", bytes), PromptTemplate::Compact);
    expect_error([&] { choose_template("llama3", bytes); },
                 "--template llama3: the tokenizer (byte) has no "
                 "<|start_header_id|> special token");
    expect_error([&] { choose_template("chatml", bytes); }, "has no <|im_start|>");
    expect_error([&] { choose_template("vicuna", bytes); }, "--template vicuna: unknown template");
    ChatTokenizer both(false, true, true);
    EXPECT_EQ(choose_template("auto", both), PromptTemplate::Llama3);
    EXPECT_EQ(choose_template("chatml", both), PromptTemplate::ChatML);
}

TEST(Chat, BadRecordsAreNamed) {
    ByteTokenizer tok;
    auto expect = [&](const std::string& line, const std::string& needle) {
        const std::string p =
            (fsys::temp_directory_path() / ("anvil_chat_" + std::to_string(::getpid()) + ".jsonl")).string();
        std::ofstream(p)
            << R"({"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]})"
            << "\n"
            << line << "\n";
        expect_error(
            [&] {
                load_dataset(p, tok, {0.0, "text", PromptTemplate::Alpaca});
            },
            p + ":2: " + needle);
        fsys::remove(p);
    };
    expect(R"({"messages":[{"role":"tool","content":"x"},{"role":"assistant","content":"y"}]})",
           "message 1: unknown role \"tool\"; use system, user or assistant");
    expect(R"({"messages":[{"role":"system","content":"x"},{"role":"user","content":"y"}]})",
           "no assistant turn; nothing to learn from this record");
    expect(
        R"({"messages":[{"role":"user","content":"x"},{"role":"system","content":"y"},{"role":"assistant","content":"z"}]})",
        "message 2: a system message must come first");
    expect(R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"  "}]})",
           "message 2: empty assistant turn");
    expect(R"({"messages":{"role":"user"}})", "\"messages\" must be an array");
    expect(R"({"messages":[]})", "\"messages\" is empty");
    expect(R"({"messages":[{"role":"user","content":["x"]}]})",
           "message 1: \"role\" and \"content\" must be strings");
    expect(R"({"messages":[{"role":"user"}]})", "message 1: not an object with \"role\" and \"content\"");
    // a record the chosen template cannot render
    const std::string p = fresh_dir("chat_llama2") + "/chats.jsonl";
    std::ofstream(p)
        << R"({"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]})"
        << "\n"
        << R"({"messages":[{"role":"assistant","content":"a"},{"role":"user","content":"b"},{"role":"assistant","content":"c"}]})"
        << "\n";
    ChatTokenizer l2(true, false, false);
    l2.bos_name = "<s>";
    expect_error(
        [&] {
            load_dataset(p, l2, {0.0, "text", PromptTemplate::Llama2});
        },
        p + ":2: message 1: the llama2 template needs");
}

TEST(Chat, ExamplesRoundTripThroughJsonl) {
    const std::string p =
        (fsys::temp_directory_path() / ("anvil_ex_" + std::to_string(::getpid()) + ".jsonl")).string();
    write_examples_jsonl(p, {kTwoTurns, Example{"Add.", "1+2", "3", {}}});
    const std::vector<Example> back = read_examples_jsonl(p);
    ASSERT_EQ(back.size(), 2u);
    ASSERT_EQ(back[0].messages.size(), kTwoTurns.messages.size());
    for (size_t i = 0; i < back[0].messages.size(); i++) {
        EXPECT_EQ(back[0].messages[i].role, kTwoTurns.messages[i].role);
        EXPECT_EQ(back[0].messages[i].content, kTwoTurns.messages[i].content);
    }
    EXPECT_EQ(back[0].answer(), "4");
    EXPECT_EQ(back[0].question(), "2+2?");
    EXPECT_EQ(back[1].answer(), "3");
    fsys::remove(p);
}

// Magpie's pre-query template: the prompt up to where the user's words go, and how the user's turn ends.
TEST(Chat, QueryFrameCutsThePromptWhereTheUsersWordsBegin) {
    ByteTokenizer bytes;
    const QueryFrame compact = query_frame(PromptTemplate::Compact, bytes);
    EXPECT_EQ(compact.prefix, std::vector<int32_t>{bytes.eot_id()})
        << "no BOS: a document starts after end-of-text";
    EXPECT_EQ(compact.end_text, "\n=> ");
    EXPECT_EQ(compact.stop, stop_tokens(PromptTemplate::Compact, bytes));
    const QueryFrame alpaca = query_frame(PromptTemplate::Alpaca, bytes);
    EXPECT_EQ(
        bytes.decode(alpaca.prefix),
        "Below is an instruction that describes a task. Write a response that appropriately completes the "
        "request.\n\n### Instruction:\n");
    EXPECT_EQ(alpaca.end_text, "\n\n### Response:\n");

    ChatTokenizer llama3(true, true, false);
    const QueryFrame l3 = query_frame(PromptTemplate::Llama3, llama3);
    EXPECT_EQ(llama3.decode(l3.prefix), "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n");
    EXPECT_TRUE(l3.end_text.empty());
    EXPECT_NE(std::find(l3.stop.begin(), l3.stop.end(), llama3.special_id("<|eot_id|>")), l3.stop.end());
    ChatTokenizer chatml(false, false, true);
    const QueryFrame cm = query_frame(PromptTemplate::ChatML, chatml);
    EXPECT_EQ(chatml.decode(cm.prefix), "<|im_start|>user\n");
    EXPECT_NE(std::find(cm.stop.begin(), cm.stop.end(), chatml.special_id("<|im_end|>")), cm.stop.end());
}

}  // namespace
}  // namespace anvil::test
