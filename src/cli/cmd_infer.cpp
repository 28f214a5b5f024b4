// anvil eval and anvil generate: load a model directory, then score data or sample text.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>

#include <unistd.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/progress.h"
#include "data/choices.h"
#include "data/dataset.h"
#include "io/fs.h"
#include "io/json_text.h"
#include "model/generate.h"
#include "runtime/compare.h"
#include "runtime/complete.h"
#include "runtime/evaluate.h"
#include "runtime/inference.h"

namespace anvil::cli {

namespace {

struct EvalOpts {
    std::string data, text_field = "text", choices, choices_log, per_example;
    int batch = 8, seq = 0, max_batches = 0, max_examples = 200, choices_limit = 0;
    std::string json;
};

void add_eval_flags(CLI::App* sub, EvalOpts& o) {
    sub->add_option("--data", o.data,
                    "text or JSONL file, all of it scored; or a directory (anvil data prepare's, or llm.c's "
                    "token shards), its validation split scored");
    sub->add_option("--text-field", o.text_field, "JSONL field holding plain text")->capture_default_str();
    sub->add_option("--choices", o.choices,
                    "multiple-choice JSONL (HellaSwag's ctx/endings/label, or context/choices/label): the "
                    "share of items whose likeliest ending is the right one, by total (acc) and per-token "
                    "(acc_norm, llm.c's HellaSwag figure) log-likelihood");
    sub->add_option("--choices-limit", o.choices_limit, "score at most this many items (0 = all)")
        ->check(kNonNegative);
    sub->add_option("--choices-log", o.choices_log,
                    "write each item's scores here (JSONL: label, pred, pred_norm, logprob and tokens per "
                    "ending)");
    sub->add_option("--batch", o.batch, "sequences per batch")->capture_default_str()->check(kPositive);
    sub->add_option("--seq", o.seq, "sequence length (default: the model's context)")->check(kPositive);
    sub->add_option("--max-batches", o.max_batches, "score at most this many batches (0 = all)")
        ->check(kNonNegative);
    sub->add_option("--max-examples", o.max_examples,
                    "instruction records to answer for exact match (0 = all)")
        ->capture_default_str()
        ->check(kNonNegative);
    sub->add_option("--per-example", o.per_example,
                    "write each instruction record's result here, a JSON line each (index, prompt, expected, "
                    "output, exact, logprob: the mean log-probability of the expected answer), for `anvil "
                    "compare`");
    add_json_flag(sub, o.json);
}

// --data: the loss and perplexity of the file (or the directory's validation split), and exact match on its
// instruction records
void eval_data(const EvalOpts& o, const InferenceSetup& l, int T, nlohmann::json& out, std::string& text) {
    // a directory (anvil data prepare's, or llm.c's shards): its validation split; a file: all of it
    const bool dir = is_data_dir(o.data);
    const Dataset d = dir ? open_data_dir(o.data, *l.tok)
                          : load_dataset(o.data, *l.tok, DataOptions{0.0, o.text_field, l.prompt});
    const TokenView& scored = dir ? d.val : d.train;
    ANVIL_CHECK(scored.size() > 1, "--data {}: {} to score", o.data,
                dir ? "the validation split is empty: nothing" : "too few tokens");
    const LossResult loss = evaluate_loss(*l.model, scored, o.batch, T, o.max_batches);
    out.update({{"loss", loss.loss}, {"ppl", loss.ppl}, {"targets", loss.targets}});
    text += fmt::format("loss {:.4f}  perplexity {:.3f}  ({} targets)\n", loss.loss, loss.ppl, loss.targets);
    const std::vector<Example> ex = dir       ? d.val_examples
                                    : d.jsonl ? read_examples_jsonl(o.data)
                                              : std::vector<Example>{};
    ANVIL_CHECK(!ex.empty() || o.per_example.empty(),
                "--per-example {}: --data {} holds no instruction records to answer (JSONL records with "
                "instruction/output or messages)",
                o.per_example, o.data);
    if (ex.empty()) return;
    const int n = o.max_examples > 0 ? std::min(o.max_examples, int(ex.size())) : int(ex.size());
    Progress bar("exact match", n, std::max(1, n / 20), "records");
    const ExactMatchResult em = exact_match(*l.model, *l.tok, l.prompt, ex, o.max_examples, 3, nullptr,
                                            !o.per_example.empty(), [&](int done) { bar.update(done, ""); });
    bar.finish(fmt::format("{:.1f}%", 100.0 * em.accuracy()));
    out["exact_match"] = em.accuracy();
    out["exact_match_n"] = em.total;
    text += fmt::format("exact match {:.1f}% of {} examples\n", 100.0 * em.accuracy(), em.total);
    if (o.per_example.empty()) return;
    write_per_example(o.per_example, em.examples);
    double logprob = 0.0;
    for (const ExampleResult& e : em.examples) logprob += e.logprob;
    out["answer_logprob"] = logprob / double(em.examples.size());
    text += fmt::format("each record's result in {} (mean answer log-probability {:.4f})\n", o.per_example,
                        logprob / double(em.examples.size()));
}

// --choices: multiple-choice accuracy, each item's scores to --choices-log
void eval_choices(const EvalOpts& o, const InferenceSetup& l, const std::vector<ChoiceItem>& items,
                  nlohmann::json& out, std::string& text) {
    const int n = choice_items(items, o.choices_limit);
    int endings = 0;
    for (int i = 0; i < n; i++) endings += int(items[size_t(i)].endings.size());
    Progress bar("multiple choice", endings, std::max(1, endings / 20), "endings");
    const ChoiceResult mc =
        multiple_choice(*l.model, *l.tok, items, n, nullptr, [&](int done) { bar.update(done, ""); });
    bar.finish(fmt::format("acc {:.1f}%, acc_norm {:.1f}%", 100.0 * mc.acc(), 100.0 * mc.acc_norm()));
    out.update({{"mc_acc", mc.acc()}, {"mc_acc_norm", mc.acc_norm()}, {"mc_n", mc.total}});
    text += fmt::format("multiple choice: acc {:.2f}% ({} of {}), acc_norm {:.2f}% ({} of {}), {}\n",
                        100.0 * mc.acc(), mc.correct, mc.total, 100.0 * mc.acc_norm(), mc.correct_norm,
                        mc.total, o.choices);
    if (o.choices_log.empty()) return;
    std::string log;
    for (const ChoiceScore& s : mc.scores)
        log += json_text(nlohmann::json{{"index", s.index},
                                        {"label", s.label},
                                        {"pred", s.pred},
                                        {"pred_norm", s.pred_norm},
                                        {"logprob", s.logprob},
                                        {"tokens", s.tokens}}) +
               "\n";
    write_file_atomic(o.choices_log, log);
}

int run_eval(const ModelFlags& mf, const EvalOpts& o) {
    ANVIL_CHECK(!o.data.empty() || !o.choices.empty(),
                "give --data FILE (loss, perplexity, exact match), --choices FILE (multiple choice) or both");
    ANVIL_CHECK(o.choices_log.empty() || !o.choices.empty(), "--choices-log needs --choices");
    // read the items before the model: a bad file fails fast
    const std::vector<ChoiceItem> items =
        o.choices.empty() ? std::vector<ChoiceItem>{} : read_choice_items(o.choices);
    InferenceSetup l = mf.load();
    const int T = o.seq > 0 ? o.seq : l.model->config().n_ctx;
    ANVIL_CHECK(T <= l.model->config().n_ctx, "--seq {}: longer than the model's context of {}", T,
                l.model->config().n_ctx);
    l.model->reserve(o.batch, T, false);
    nlohmann::json out = nlohmann::json::object();
    std::string text;
    if (!o.data.empty()) eval_data(o, l, T, out, text);
    if (!items.empty()) eval_choices(o, l, items, out, text);
    emit_result(o.json, out, text);
    return 0;
}

struct GenerateOpts {
    std::string prompt, prompt_file, instruction, input, system, json;
    SampleOptions s;
    bool no_stop = false, chat = false, logprobs = false;
    int samples = 1;
};

// what the model is given: a prompt, an instruction record or a conversation
void add_prompt_flags(CLI::App* sub, GenerateOpts& o) {
    sub->add_option("--prompt", o.prompt, "text to continue (with --chat: the user's message)");
    sub->add_option("--prompt-file", o.prompt_file,
                    "--prompt's text from a file, whole (nanoGPT's start=\"FILE:prompt.txt\")")
        ->check(CLI::ExistingFile);
    sub->add_option("--instruction", o.instruction,
                    "wrap as an instruction record (with --input) in the prompt template");
    sub->add_option("--input", o.input, "input of the instruction record");
    sub->add_flag(
        "--chat", o.chat,
        "a conversation in the model's chat template: the user's turns from --prompt, else one per line "
        "of standard input (an empty line or end of input ends it); only the replies are printed");
    sub->add_option(
        "--system", o.system,
        "with --chat: a system message before the conversation (kept when old turns are dropped)");
}

// how tokens are drawn, and how many completions
void add_sampling_flags(CLI::App* sub, GenerateOpts& o) {
    sub->add_option("--max-new-tokens", o.s.max_new_tokens, "tokens to generate")
        ->capture_default_str()
        ->check(kPositive);
    sub->add_option("--temperature", o.s.temperature, "sampling temperature (0 = greedy)")
        ->capture_default_str()
        ->check(kNonNegative);
    sub->add_option("--top-k", o.s.top_k, "sample from the k most likely tokens (0 = off)")
        ->capture_default_str()
        ->check(kNonNegative);
    sub->add_option("--top-p", o.s.top_p, "nucleus sampling mass (1 = off)")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1.0));
    sub->add_option("--presence-penalty", o.s.presence_penalty,
                    "subtracted once from the logit of every token the answer has generated (OpenAI's "
                    "presence_penalty, -2 to 2)")
        ->capture_default_str()
        ->check(CLI::Range(-2.0, 2.0));
    sub->add_option("--frequency-penalty", o.s.frequency_penalty,
                    "subtracted from a token's logit for every time the answer has generated it (OpenAI's "
                    "frequency_penalty, -2 to 2)")
        ->capture_default_str()
        ->check(CLI::Range(-2.0, 2.0));
    sub->add_option(
           "--repetition-penalty", o.s.repetition_penalty,
           "divides the positive logits and multiplies the negative ones of every token in the prompt "
           "or the answer so far (Hugging Face's repetition_penalty; 1 = off)")
        ->capture_default_str()
        ->check(CLI::Range(0.01, 10.0));
    sub->add_option("--min-p", o.s.min_p,
                    "keep only tokens at least this fraction as likely as the likeliest (0 = off)")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1.0));
    sub->add_option("--seed", o.s.seed, "sampling seed")->capture_default_str();
    sub->add_flag("--no-stop", o.no_stop, "keep going past the end-of-text and end-of-turn tokens");
    sub->add_flag("--logprobs", o.logprobs,
                  "--json lists each generated token's log-probability under the model (natural log, before "
                  "temperature and filters)");
    sub->add_option("--num-samples,-n", o.samples,
                    "independent completions of the prompt (nanoGPT's num_samples, Hugging Face's "
                    "num_return_sequences), sample i drawn with --seed + i, printed one after another "
                    "between lines of dashes")
        ->capture_default_str()
        ->check(kPositive);
    add_json_flag(sub, o.json)
        ->description(
            "print one JSON object instead of streaming: the text, prompt and completion tokens, time "
            "to first token, tokens/s and why it ended (with --num-samples N > 1: {\"samples\": [N such "
            "objects]}); --json FILE streams the text and writes the JSON to FILE");
}

// The flags that contradict each other, and --prompt-file read into --prompt.
void check_generate_flags(GenerateOpts& o) {
    if (!o.prompt_file.empty()) {
        ANVIL_CHECK(o.prompt.empty(), "give --prompt or --prompt-file, not both");
        o.prompt = read_file(o.prompt_file);
        ANVIL_CHECK(!o.prompt.empty(), "--prompt-file {}: the file is empty", o.prompt_file);
    }
    ANVIL_CHECK(o.chat || !o.prompt.empty() || !o.instruction.empty(),
                "give --prompt TEXT, --prompt-file FILE, --instruction TEXT or --chat");
    ANVIL_CHECK(!o.chat || o.instruction.empty(),
                "--chat takes the user's message from --prompt, not --instruction");
    ANVIL_CHECK(o.chat || o.system.empty(), "--system needs --chat");
    ANVIL_CHECK(o.s.top_p > 0.0f, "--top-p must be greater than 0");
    ANVIL_CHECK(!o.chat || o.json.empty(),
                "--json describes one completion; use it with --prompt or "
                "--instruction, not --chat");
    ANVIL_CHECK(!o.chat || o.samples == 1,
                "--num-samples {}: --chat answers each turn once; use --prompt or --instruction for "
                "several completions",
                o.samples);
}

// One reply to `prompt`, streamed to stdout when `stream` (whole characters); returns its text and leaves its
// figures in `stats`.
std::string stream_reply(Generator& gen, const Tokenizer& tok, const SampleOptions& s,
                         const std::vector<int32_t>& prompt, bool stream, nlohmann::json& stats,
                         bool logprobs = false) {
    const auto show = [&](const std::string& piece) {
        if (stream && !piece.empty()) {
            std::fwrite(piece.data(), 1, piece.size(), stdout);
            std::fflush(stdout);
        }
        return true;
    };
    const TextCompletion c = complete_text(gen, tok, s, prompt, {}, show, logprobs);
    if (stream) {
        std::printf("\n");
        std::fflush(stdout);
    }
    stats = {{"text", c.text},
             {"prompt_tokens", prompt.size()},
             {"completion_tokens", c.tokens.size()},
             {"finish_reason", c.finish_reason},
             {"time_to_first_token_ms", c.ttft_ms},
             {"total_ms", c.total_ms},
             {"tokens_per_s", c.tokens_per_s},
             {"replayed_steps", gen.replays()},  // decode steps replayed as CUDA graphs so far (0: launched)
             {"tokens", c.tokens}};
    if (logprobs) stats["logprobs"] = c.logprobs;
    return c.text;
}

// --prompt or --instruction: --num-samples completions, then the JSON where --json asks
void generate_completions(const GenerateOpts& o, const InferenceSetup& l, Generator& gen, SampleOptions s,
                          bool stream) {
    const Tokenizer& tok = *l.tok;
    const Example ex{o.instruction, o.input, "", {}};
    const bool inst = !o.instruction.empty();
    const std::vector<int32_t> prompt = inst ? prompt_tokens(ex, l.prompt, tok) : tok.encode_prompt(o.prompt);
    const std::string shown = inst ? render_text(ex, l.prompt, tok, true) : o.prompt;
    nlohmann::json all = nlohmann::json::array(), stats;
    for (int i = 0; i < o.samples; i++) {
        s.seed = o.s.seed + uint64_t(i);
        if (stream) std::printf("%s", shown.c_str());
        stream_reply(gen, tok, s, prompt, stream, stats, o.logprobs);
        all.push_back(stats);
        if (stream && o.samples > 1) std::printf("---------------\n");
    }
    const nlohmann::json result = o.samples > 1 ? nlohmann::json{{"samples", all}} : stats;
    if (o.json == "-")
        std::printf("%s\n", json_text(result, 2).c_str());
    else if (!o.json.empty())
        write_file_atomic(o.json, json_text(result, 2) + "\n");
}

// --chat: the user's turns (--prompt, else standard input's lines) answered in the chat template; past the
// context (with room for the reply), the oldest whole turns go, the system message stays (as llama.cpp's
// context shift does), instead of cutting the rendering mid-turn
void chat(const GenerateOpts& o, const InferenceSetup& l, Generator& gen, const SampleOptions& s) {
    const Tokenizer& tok = *l.tok;
    std::string note;  // the tokenizer's system message, where chatml puts it first (Qwen's)
    if (l.prompt == PromptTemplate::ChatML && o.system.empty() && !tok.default_system().empty())
        note = fmt::format(" (system message the tokenizer's: \"{}\")", tok.default_system());
    std::fprintf(stderr, "anvil: chat template %s%s\n", template_name(l.prompt), note.c_str());
    Example conv;
    if (!o.system.empty()) conv.messages.push_back({Role::System, o.system});
    const bool tty = isatty(fileno(stdin)) && o.prompt.empty();
    nlohmann::json stats;
    for (;;) {
        std::string user = o.prompt;
        if (user.empty()) {
            if (tty) std::fprintf(stderr, "> ");
            std::string line;
            if (!std::getline(std::cin, line) || line.empty()) break;
            if (!line.empty() && line.back() == '\r') line.pop_back();
            user = line;
        }
        conv.messages.push_back({Role::User, user});
        std::vector<int32_t> prompt = prompt_tokens(conv, l.prompt, tok);
        const int n_ctx = l.model->config().n_ctx;
        const size_t budget = size_t(n_ctx - std::min(s.max_new_tokens, n_ctx / 2));
        const size_t first = o.system.empty() ? 0 : 1;
        int dropped = 0;
        while (prompt.size() > budget && conv.messages.size() >= first + 3) {
            conv.messages.erase(conv.messages.begin() + long(first), conv.messages.begin() + long(first) + 2);
            prompt = prompt_tokens(conv, l.prompt, tok);
            dropped++;
        }
        if (dropped)
            std::fprintf(stderr,
                         "anvil: the conversation passed the context (%d tokens, %d kept for the reply): "
                         "dropped the oldest %d turn%s%s\n",
                         n_ctx, n_ctx - int(budget), dropped, dropped == 1 ? "" : "s",
                         first ? ", kept the system message" : "");
        conv.messages.push_back({Role::Assistant, stream_reply(gen, tok, s, prompt, true, stats)});
        if (!o.prompt.empty()) break;
    }
}

int run_generate(const ModelFlags& mf, GenerateOpts o) {
    check_generate_flags(o);
    InferenceSetup l = mf.load();
    SampleOptions s = o.s;
    if (!o.no_stop) s.stop_tokens = stop_tokens(l.prompt, *l.tok);
    s.vocab_real = l.tok->vocab_size();
    Generator gen(*l.model);
    if (o.chat)
        chat(o, l, gen, s);
    else
        generate_completions(o, l, gen, s, o.json != "-");  // bare --json: the JSON alone on stdout
    return 0;
}

}  // namespace

Command add_eval(CLI::App& app) {
    CLI::App* sub = app.add_subcommand(
        "eval",
        "validation loss, perplexity, exact-match and multiple-choice (HellaSwag) accuracy of a model");
    auto mf = std::make_shared<ModelFlags>();
    auto o = std::make_shared<EvalOpts>();
    mf->add(sub);
    add_eval_flags(sub, *o);
    return {sub, [mf, o] { return run_eval(*mf, *o); }};
}

Command add_generate(CLI::App& app) {
    CLI::App* sub = app.add_subcommand("generate", "sample text from a model (KV-cached)");
    auto mf = std::make_shared<ModelFlags>();
    auto o = std::make_shared<GenerateOpts>();
    o->s.max_new_tokens = 128;
    o->s.temperature = 0.8f;
    mf->add(sub);
    add_prompt_flags(sub, *o);
    add_sampling_flags(sub, *o);
    return {sub, [mf, o] { return run_generate(*mf, *o); }};
}

}  // namespace anvil::cli
