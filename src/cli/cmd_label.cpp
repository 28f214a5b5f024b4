// anvil data pseudo-label: answers for records that have none, sampled --num-samples times from a model on
// the serving scheduler (continuous batching), voted on, optionally checked by a program or a pattern, and
// kept only where the vote is clear enough (data/pseudo_label.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <thread>

#include <fmt/format.h>

#include "cli/commands.h"
#include "core/progress.h"
#include "data/pseudo_label.h"
#include "io/fs.h"
#include "io/json_text.h"
#include "serve/batch.h"

namespace anvil::cli {

namespace {

struct LabelOpts {
    std::string in, out, report, verify;
    int samples = 5, max_new_tokens = 128, batch = 16, jobs = 0;
    float temperature = 0.7f, top_p = 1.0f;
    int top_k = 0;
    uint64_t seed = 1;
    VoteOptions vote;
};

// Every record's --num-samples answers: sample j of record i draws with seed + i * N + j, as `anvil generate
// --seed (seed + i N) --num-samples N` draws them; the scheduler batches them all.
std::vector<std::vector<Candidate>> sample_answers(const LabelOpts& o, InferenceSetup& l,
                                                   const std::vector<UnlabeledRecord>& recs) {
    const Tokenizer& tok = *l.tok;
    const int n_ctx = l.model->config().n_ctx;
    std::vector<std::vector<int32_t>> prompts;
    for (const UnlabeledRecord& r : recs) {
        ANVIL_CHECK(template_problem(r.ex, l.prompt, tok).empty(), "{} line {}: {}", o.in, r.line,
                    template_problem(r.ex, l.prompt, tok));
        prompts.push_back(prompt_tokens(r.ex, l.prompt, tok));
        ANVIL_CHECK(int(prompts.back().size()) + 1 < n_ctx,
                    "{} line {}: the prompt is {} tokens, the model's context {}; shorten the record", o.in,
                    r.line, prompts.back().size(), n_ctx);
    }
    SampleOptions s;
    s.temperature = o.temperature, s.top_p = o.top_p, s.top_k = o.top_k;
    s.max_new_tokens = o.max_new_tokens;
    s.stop_tokens = stop_tokens(l.prompt, tok);
    s.vocab_real = tok.vocab_size();
    std::vector<serve::BatchRequest> reqs;
    for (size_t i = 0; i < recs.size(); i++)
        for (int j = 0; j < o.samples; j++) {
            reqs.push_back({prompts[i], s});
            reqs.back().opt.seed = o.seed + uint64_t(i) * uint64_t(o.samples) + uint64_t(j);
        }
    Progress bar("pseudo-label: sampling", int64_t(reqs.size()),
                 std::max<int64_t>(1, int64_t(reqs.size()) / 20), "answers");
    const std::vector<serve::BatchResult> res =
        serve::sample_batch(*l.model, o.batch, reqs, [&](size_t n) { bar.update(int64_t(n), ""); });
    bar.finish(fmt::format("{} answers", reqs.size()));
    std::vector<std::vector<Candidate>> out(recs.size());
    for (size_t k = 0; k < res.size(); k++) {
        Candidate c;
        c.text = tok.decode(res[k].ids);
        c.logprob = res[k].ids.empty() ? 0.0 : res[k].logprob / double(res[k].ids.size());
        c.finished = res[k].finish == serve::Finish::Stop;
        out[k / size_t(o.samples)].push_back(std::move(c));
    }
    return out;
}

int run_pseudo_label(const ModelFlags& mf, const LabelOpts& o) {
    ANVIL_CHECK(o.in != o.out,
                "--out {}: the same file as --in; write elsewhere (the input is never replaced)", o.out);
    const std::vector<UnlabeledRecord> recs =
        read_unlabeled(o.in);  // bad records fail before the model loads
    std::unique_ptr<AnswerChecker> checker;
    if (!o.verify.empty()) checker = std::make_unique<AnswerChecker>(o.verify);
    InferenceSetup l = mf.load();
    ANVIL_CHECK(l.tok, "--model {}: no tokenizer, so it cannot generate; pass --tokenizer", mf.o.model_dir);
    std::vector<std::vector<Candidate>> cands = sample_answers(o, l, recs);
    if (checker) {
        Progress bar("pseudo-label: checking", int64_t(recs.size()),
                     std::max<int64_t>(1, int64_t(recs.size()) / 20), "records");
        const int jobs = o.jobs > 0 ? o.jobs : std::max(1, int(std::thread::hardware_concurrency()));
        checker->check(recs, cands, jobs, [&](size_t n) { bar.update(int64_t(n), ""); });
        bar.finish("");
    }
    std::string kept, report;
    size_t n_kept = 0, by_reason[5] = {};
    for (size_t i = 0; i < recs.size(); i++) {
        const Vote v = vote(cands[i], o.vote);
        by_reason[size_t(v.reason)]++;
        nlohmann::ordered_json prov = {{"model", l.adapter_dir.empty() ? l.base_dir : l.adapter_dir},
                                       {"seed", o.seed + uint64_t(i) * uint64_t(o.samples)},
                                       {"samples", v.samples},
                                       {"temperature", o.temperature},
                                       {"votes", v.votes},
                                       {"valid", v.valid},
                                       {"agreement", v.agreement},
                                       {"logprob", v.logprob}};
        if (checker) prov["verify"] = checker->spec();
        if (v.reason == LabelReason::Kept) {
            nlohmann::ordered_json j = labelled(recs[i], v.answer);
            j["pseudo_label"] = prov;  // the trainer reads only the record's own fields
            kept += json_text(j) + "\n";
            n_kept++;
        } else {
            nlohmann::ordered_json j = {{"line", recs[i].line}, {"reason", reason_name(v.reason)}};
            if (!v.answer.empty()) j["majority"] = v.answer;
            j.update(prov);
            report += json_text(j) + "\n";
        }
    }
    const std::string counts = fmt::format(
        "{} unfinished (no sample ended within --max-new-tokens), {} rejected (no answer passed the "
        "checker), "
        "{} below --min-agreement, {} below --min-logprob",
        by_reason[1], by_reason[2], by_reason[3], by_reason[4]);
    ANVIL_CHECK(n_kept > 0, "pseudo-label: no record kept ({}); nothing written", counts);
    write_file_atomic(o.out, kept);
    if (!o.report.empty()) write_file_atomic(o.report, report);
    std::printf("pseudo-label: %zu records, kept %zu (%.1f%%) in %s; dropped %s%s\n", recs.size(), n_kept,
                100.0 * double(n_kept) / double(recs.size()), o.out.c_str(), counts.c_str(),
                o.report.empty() ? "" : fmt::format("; each dropped record in {}", o.report).c_str());
    return 0;
}

}  // namespace

Command add_pseudo_label(CLI::App* data) {
    CLI::App* sub = data->add_subcommand(
        "pseudo-label",
        "answer records that have none: --num-samples answers each from a model, the majority kept where it "
        "is clear (--min-agreement, --min-logprob) and a checker accepts it (--verify)");
    auto mf = std::make_shared<ModelFlags>();
    auto o = std::make_shared<LabelOpts>();
    mf->add(sub);
    sub->add_option(
           "--in", o->in,
           "JSONL records without answers: {\"instruction\", \"input\"} (no \"output\"), or chats whose "
           "last message is the user's")
        ->required();
    sub->add_option("--out", o->out,
                    "the kept records with their answers (\"output\", or a final assistant message) and a "
                    "\"pseudo_label\" field of provenance the trainer ignores")
        ->required();
    sub->add_option("--num-samples,-n", o->samples, "answers sampled a record")
        ->capture_default_str()
        ->check(kPositive);
    sub->add_option("--temperature", o->temperature, "sampling temperature (0: greedy, every sample alike)")
        ->capture_default_str()
        ->check(kNonNegative);
    sub->add_option("--top-p", o->top_p, "nucleus sampling")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1.0));
    sub->add_option("--top-k", o->top_k, "sample among the k likeliest (0: all)")->check(kNonNegative);
    sub->add_option("--seed", o->seed, "sample j of record i draws with seed + i * N + j")
        ->capture_default_str();
    sub->add_option("--max-new-tokens", o->max_new_tokens,
                    "an answer's token limit; a sample cut there counts as no answer")
        ->capture_default_str()
        ->check(kPositive);
    sub->add_option("--min-agreement", o->vote.min_agreement,
                    "keep a record only where its majority answer is at least this share of the samples")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1.0));
    sub->add_option("--min-logprob", o->vote.min_logprob,
                    "... and the mean log-probability of its tokens is at least this (natural log; default: "
                    "no bound)");
    sub->add_option(
        "--verify", o->verify,
        "regex:PATTERN (the answer must contain a match) or cmd:PROGRAM (run with the record and its "
        "answer as one JSON line on standard input; exit status 0 accepts)");
    sub->add_option("--jobs", o->jobs, "checker programs at a time (0: one a core)")->check(kNonNegative);
    sub->add_option("--batch", o->batch, "sequences decoded together")
        ->capture_default_str()
        ->check(kPositive);
    sub->add_option("--report", o->report,
                    "each dropped record: its line, why, its majority answer and the vote");
    return {sub, [mf, o] { return run_pseudo_label(*mf, *o); }};
}

}  // namespace anvil::cli
