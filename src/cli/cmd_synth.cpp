// anvil data synth: instruction records written by a model. Questions come from Magpie's pre-query template
// (the chat template up to the user's words, so the model writes a user turn) or from Self-Instruct's
// numbered-task prompt over --seed-file examples; each passes the filter (data/synth.h: length, leakage into
// --against, exact and near duplicates, ROUGE-L novelty against what is kept) before the model answers it.
// Work goes in rounds of 4 x --batch attempts, questions then answers, each on the serving scheduler.
#include <algorithm>
#include <cstdio>
#include <memory>

#include <fmt/format.h>

#include "cli/commands.h"
#include "core/progress.h"
#include "core/text.h"
#include "data/records.h"
#include "data/synth.h"
#include "io/fs.h"
#include "io/json_text.h"
#include "serve/batch.h"

namespace anvil::cli {

namespace {

struct SynthOpts {
    std::string out, method = "magpie", seed_file, report;
    std::vector<std::string> against;
    int n = 0, max_attempts = 0, batch = 16, shots = 8, from_generated = 2;
    int max_question_tokens = 96, max_new_tokens = 256;
    float temperature = 1.0f, top_p = 1.0f, answer_temperature = 0.0f;
    uint64_t seed = 1;
    SynthFilterOptions filter;
};

// A record's question as the filter compares it: the instruction (and its input), a chat's last user turn,
// or a text record's text.
std::vector<std::pair<std::string, size_t>> read_questions(const std::string& path, const char* flag) {
    std::vector<std::pair<std::string, size_t>> out;
    read_lines(path, [&](const std::string& line, size_t lineno) {
        if (line.find_first_not_of(" \t\r") == std::string::npos) return;
        const RawRecord r = parse_jsonl_line(line, path, lineno, "text");
        ANVIL_CHECK(r.reject.empty(), "{} {} line {}: {}", flag, path, lineno, r.reject);
        if (!r.example)
            out.emplace_back(r.text, lineno);
        else if (r.ex.chat() || r.ex.input.empty())
            out.emplace_back(r.ex.question(), lineno);
        else
            out.emplace_back(r.ex.instruction + "\n" + r.ex.input, lineno);
    });
    ANVIL_CHECK(!out.empty(), "{} {}: no records in it", flag, path);
    return out;
}

struct Attempt {
    std::string question, answer;
    SynthVerdict v;
};

class Synthesizer {
public:
    Synthesizer(const SynthOpts& o, InferenceSetup& l) : o_(o), l_(l), tok_(*l.tok), filter_(o.filter) {
        n_ctx_ = l.model->config().n_ctx;
        frame_ = query_frame(l.prompt, tok_);
        if (o.method == "self-instruct") frame_ = QueryFrame{{}, {tok_.eot_id()}, "\n"};
        if (!o.seed_file.empty())
            for (const auto& [q, line] : read_questions(o.seed_file, "--seed-file")) {
                seeds_.push_back(q);
                filter_.add_seed(q, line);
            }
        for (const std::string& f : o.against)
            for (const auto& [q, line] : read_questions(f, "--against"))
                filter_.add_held_out(q, fmt::format("{}:{}", f, line));
    }

    // Attempts [first, first + count): their questions, the filter's verdicts, the answers of those it
    // passes. A question the filter passes counts as kept for the questions after it, whether or not it is
    // answered.
    std::vector<Attempt> round(int first, int count) {
        std::vector<serve::BatchRequest> reqs;
        for (int a = first; a < first + count; a++) reqs.push_back(question_request(a));
        const std::string& end = frame_.end_text;
        // sampled to a stop token or the limit and cut at `end` after (not cancelled on seeing it, which
        // would make the passes depend on timing)
        const std::vector<serve::BatchResult> qs = serve::sample_batch(*l_.model, o_.batch, reqs);
        std::vector<Attempt> out(static_cast<size_t>(count));
        std::vector<Example> answers;
        std::vector<uint64_t> seeds;
        std::vector<size_t> answered;
        for (size_t k = 0; k < qs.size(); k++) {
            Attempt& at = out[k];
            const std::string text = tok_.decode(qs[k].ids);
            const size_t cut = end.empty() ? std::string::npos : text.find(end);
            at.question = trim(text.substr(0, cut));
            if (cut == std::string::npos && qs[k].finish != serve::Finish::Stop) {
                at.v.reason = SynthReason::Unfinished;
                continue;
            }
            at.v = filter_.check(at.question);
            if (at.v.reason != SynthReason::Kept) continue;
            filter_.keep(at.question, fmt::format("attempt {}", first + int(k)));
            Example e;
            e.instruction = at.question;
            answers.push_back(std::move(e));
            seeds.push_back(o_.seed + uint64_t(first) + k);
            answered.push_back(k);
        }
        SampleOptions s;
        s.temperature = o_.answer_temperature, s.top_p = o_.top_p, s.max_new_tokens = o_.max_new_tokens;
        const std::vector<serve::Answer> as =
            serve::answer_examples(*l_.model, tok_, l_.prompt, answers, s, seeds, o_.batch);
        for (size_t j = 0; j < as.size(); j++) {
            Attempt& at = out[answered[j]];
            at.answer = trim(as[j].text);
            if (!as[j].finished || at.answer.empty())
                at.v = {SynthReason::NoAnswer, "", 0};
            else if (!well_formed(at.answer))
                at.v = {SynthReason::Malformed, "the answer", 0};
        }
        return out;
    }
    void keep(const Attempt& at) { generated_.push_back(at.question); }  // Self-Instruct's pool

private:
    SampleOptions sampling(int attempt) const {
        SampleOptions s;
        s.temperature = o_.temperature, s.top_p = o_.top_p;
        s.max_new_tokens = o_.max_question_tokens;
        s.seed = o_.seed + uint64_t(attempt);
        s.vocab_real = tok_.vocab_size();
        s.stop_tokens = frame_.stop;
        return s;
    }
    // Attempt a's question prompt: Magpie's pre-query template, or Self-Instruct's tasks (as many of
    // --shots as the context holds with room for the question).
    serve::BatchRequest question_request(int a) const {
        serve::BatchRequest r{frame_.prefix, sampling(a)};
        if (o_.method == "self-instruct") {
            Rng rng(o_.seed ^ (0x5e1f'1257'7ac0'0000ull + uint64_t(a)));
            std::vector<std::string> tasks = draw_tasks(seeds_, generated_, o_.shots, o_.from_generated, rng);
            for (;;) {
                r.prompt = tok_.encode_prompt(self_instruct_prompt(tasks));
                if (int(r.prompt.size()) + o_.max_question_tokens < n_ctx_ || tasks.size() <= 1) break;
                tasks.pop_back();
            }
        }
        ANVIL_CHECK(int(r.prompt.size()) + 1 < n_ctx_,
                    "the question prompt is {} tokens, the model's context {}{}", r.prompt.size(), n_ctx_,
                    o_.method == "self-instruct" ? "; give --seed-file shorter tasks" : "");
        r.opt.max_new_tokens = std::min(o_.max_question_tokens, n_ctx_ - int(r.prompt.size()) - 1);
        return r;
    }

    const SynthOpts& o_;
    InferenceSetup& l_;
    const Tokenizer& tok_;
    SynthFilter filter_;
    QueryFrame frame_;
    int n_ctx_ = 0;
    std::vector<std::string> seeds_, generated_;
};

nlohmann::ordered_json provenance(const SynthOpts& o, const InferenceSetup& l, int attempt) {
    return {{"method", o.method},
            {"model", l.adapter_dir.empty() ? l.base_dir : l.adapter_dir},
            {"seed", o.seed + uint64_t(attempt)},
            {"attempt", attempt},
            {"temperature", o.temperature}};
}

void check_opts(const SynthOpts& o) {
    ANVIL_CHECK(o.method == "magpie" || o.method == "self-instruct",
                "--method {}: use magpie or self-instruct", o.method);
    ANVIL_CHECK(
        o.method != "self-instruct" || !o.seed_file.empty(),
        "--method self-instruct needs --seed-file (instruction records whose tasks the prompt shows)");
    for (const std::string& f : o.against)
        ANVIL_CHECK(f != o.out, "--out {}: the same file as --against; write elsewhere", o.out);
    ANVIL_CHECK(o.out != o.seed_file, "--out {}: the same file as --seed-file; write elsewhere", o.out);
    ANVIL_CHECK(o.filter.min_words <= o.filter.max_words, "--min-words {} is above --max-words {}",
                o.filter.min_words, o.filter.max_words);
}

int run_synth(const ModelFlags& mf, const SynthOpts& o) {
    check_opts(o);
    InferenceSetup l = mf.load();
    ANVIL_CHECK(l.tok, "--model {}: no tokenizer, so it cannot generate; pass --tokenizer", mf.o.model_dir);
    Synthesizer synth(o, l);  // reads --seed-file and --against
    const int max_attempts = o.max_attempts > 0 ? o.max_attempts : 10 * o.n;
    std::string kept, report;
    int n_kept = 0, attempts = 0;
    size_t by_reason[kSynthReasons] = {};
    Progress bar("synth", o.n, 1, "records");
    while (n_kept < o.n && attempts < max_attempts) {
        const int count = std::min(4 * o.batch, max_attempts - attempts);
        const std::vector<Attempt> got = synth.round(attempts, count);
        for (int k = 0; k < count && n_kept < o.n; k++) {
            const Attempt& at = got[size_t(k)];
            const int a = attempts++;
            by_reason[size_t(at.v.reason)]++;
            if (at.v.reason == SynthReason::Kept) {
                synth.keep(at);
                nlohmann::ordered_json j = {{"instruction", at.question}, {"output", at.answer}};
                j["synth"] = provenance(o, l, a);  // the trainer reads only the record's own fields
                kept += json_text(j) + "\n";
                n_kept++;
                continue;
            }
            nlohmann::ordered_json j = {{"attempt", a}, {"reason", synth_reason_name(at.v.reason)}};
            if (!at.question.empty()) j["question"] = at.question;
            if (!at.v.match.empty()) j["match"] = at.v.match;
            if (at.v.score > 0) j["score"] = at.v.score;
            report += json_text(j) + "\n";
        }
        bar.update(n_kept, fmt::format("{} attempts", attempts));
    }
    bar.finish(fmt::format("{} attempts", attempts));
    std::string counts;
    for (size_t r = 1; r < kSynthReasons; r++)
        counts += fmt::format("{}{} {}", r > 1 ? ", " : "", by_reason[r], synth_reason_name(SynthReason(r)));
    ANVIL_CHECK(n_kept > 0, "synth: no record kept of {} attempts ({}); nothing written", attempts, counts);
    write_file_atomic(o.out, kept);
    if (!o.report.empty()) write_file_atomic(o.report, report);
    std::printf("synth: kept %d of %d attempts in %s; dropped %s%s\n", n_kept, attempts, o.out.c_str(),
                counts.c_str(), o.report.empty() ? "" : fmt::format("; each in {}", o.report).c_str());
    if (n_kept < o.n)
        std::fprintf(stderr,
                     "synth: warning: %d of the %d records asked for; --max-attempts %d was reached\n",
                     n_kept, o.n, max_attempts);
    return 0;
}

}  // namespace

Command add_synth(CLI::App* data) {
    CLI::App* sub = data->add_subcommand(
        "synth",
        "instruction records written by a model (Magpie or Self-Instruct), each question new (ROUGE-L, near "
        "duplicates), not leaked from --against, then answered by the model");
    auto mf = std::make_shared<ModelFlags>();
    auto o = std::make_shared<SynthOpts>();
    mf->add(sub);
    sub->add_option("--method", o->method,
                    "magpie: the model writes the user's turn from its template's start; self-instruct: the "
                    "next of a numbered list of --seed-file tasks")
        ->capture_default_str();
    sub->add_option("--n", o->n, "records to write")->required()->check(kPositive);
    sub->add_option("--out", o->out, "the records: {\"instruction\", \"output\", \"synth\": provenance}")
        ->required();
    sub->add_option("--seed-file", o->seed_file,
                    "JSONL examples: the tasks self-instruct shows; with magpie, questions a new one must "
                    "differ from");
    sub->add_option("--against", o->against,
                    "held-out files: drop a question close to one of theirs (leakage)");
    sub->add_option("--report", o->report, "each dropped attempt: why, its question, what it is close to");
    sub->add_option("--max-rouge", o->filter.max_rouge,
                    "drop a question whose ROUGE-L with a kept, seed or held-out one reaches this")
        ->capture_default_str()
        ->check(CLI::Range(0.01, 1.0));
    sub->add_option("--near-threshold", o->filter.near.threshold,
                    "drop a question of this Jaccard similarity (3-word shingles) with a kept one")
        ->capture_default_str()
        ->check(CLI::Range(0.01, 1.0));
    sub->add_option("--min-words", o->filter.min_words, "a question's fewest words")
        ->capture_default_str()
        ->check(kPositive);
    sub->add_option("--max-words", o->filter.max_words, "a question's most words")
        ->capture_default_str()
        ->check(kPositive);
    sub->add_option("--temperature", o->temperature, "the questions' sampling temperature")
        ->capture_default_str()
        ->check(kNonNegative);
    sub->add_option("--top-p", o->top_p, "the questions' nucleus")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1.0));
    sub->add_option("--answer-temperature", o->answer_temperature, "the answers' (0: greedy, as Magpie)")
        ->capture_default_str()
        ->check(kNonNegative);
    sub->add_option("--max-question-tokens", o->max_question_tokens,
                    "a question not ended by then is dropped")
        ->capture_default_str()
        ->check(kPositive);
    sub->add_option("--max-new-tokens", o->max_new_tokens, "an answer not ended by then is dropped")
        ->capture_default_str()
        ->check(kPositive);
    sub->add_option("--shots", o->shots, "self-instruct: tasks a prompt shows")
        ->capture_default_str()
        ->check(kPositive);
    sub->add_option("--from-generated", o->from_generated,
                    "self-instruct: of them, at most this many generated ones")
        ->capture_default_str()
        ->check(kNonNegative);
    sub->add_option("--max-attempts", o->max_attempts, "questions to try at most (0: 10 x --n)")
        ->check(kNonNegative);
    sub->add_option("--seed", o->seed, "attempt a samples with seed + a")->capture_default_str();
    sub->add_option("--batch", o->batch, "sequences decoded together; a round is 4 x this many attempts")
        ->capture_default_str()
        ->check(kPositive);
    return {sub, [mf, o] { return run_synth(*mf, *o); }};
}

}  // namespace anvil::cli
