#include "data/pseudo_label.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "data/regex_split.h"
#include "io/fs.h"
#include "io/json_text.h"
#include "io/process.h"

namespace anvil {

namespace {

std::string string_field(const nlohmann::ordered_json& j, const char* key, const std::string& where) {
    if (!j.contains(key) || j[key].is_null()) return {};
    ANVIL_CHECK(j[key].is_string(), "{}: field \"{}\" is not a string", where, key);
    return j[key].get<std::string>();
}

}  // namespace

std::vector<UnlabeledRecord> read_unlabeled(const std::string& path) {
    std::vector<UnlabeledRecord> out;
    read_lines(path, [&](const std::string& line, size_t lineno) {
        if (line.find_first_not_of(" \t\r") == std::string::npos) return;
        const std::string where = fmt::format("{} line {}", path, lineno);
        UnlabeledRecord r;
        r.line = lineno;
        try {
            r.json = nlohmann::ordered_json::parse(line);
        } catch (const nlohmann::json::parse_error& e) {
            fail("{}: not JSON ({}); fix the line or remove it", where, e.what());
        }
        ANVIL_CHECK(r.json.is_object(), "{}: each line must be a JSON object", where);
        if (r.json.contains("messages")) {
            const auto& m = r.json["messages"];
            ANVIL_CHECK(m.is_array() && !m.empty(), "{}: \"messages\" must be a non-empty list", where);
            for (const auto& msg : m) {
                ANVIL_CHECK(msg.is_object() && msg.contains("role") && msg["role"].is_string() &&
                                msg.contains("content") && msg["content"].is_string(),
                            "{}: each message needs a string \"role\" and \"content\"", where);
                Role role;
                ANVIL_CHECK(parse_role(msg["role"].get<std::string>(), &role),
                            "{}: role \"{}\"; use system, user or assistant", where,
                            msg["role"].get<std::string>());
                r.ex.messages.push_back({role, msg["content"].get<std::string>()});
            }
            ANVIL_CHECK(
                r.ex.messages.back().role != Role::Assistant,
                "{}: the chat already ends with an assistant turn; pseudo-label answers chats whose last "
                "message is the user's (remove the answer, or leave the record out)",
                where);
            ANVIL_CHECK(r.ex.messages.back().role == Role::User,
                        "{}: the chat ends with a {} message; it must end with the user's", where,
                        role_name(r.ex.messages.back().role));
        } else {
            ANVIL_CHECK(r.json.contains("instruction"),
                        "{}: neither an instruction record {{\"instruction\", \"input\"}} nor a chat "
                        "{{\"messages\"}}",
                        where);
            r.ex.instruction = string_field(r.json, "instruction", where);
            r.ex.input = string_field(r.json, "input", where);
            ANVIL_CHECK(!r.ex.instruction.empty(), "{}: empty \"instruction\"", where);
            ANVIL_CHECK(string_field(r.json, "output", where).empty(),
                        "{}: the record already has an \"output\"; pseudo-label answers records without one "
                        "(remove it, or leave the record out)",
                        where);
        }
        out.push_back(std::move(r));
    });
    ANVIL_CHECK(!out.empty(), "{}: no records in it", path);
    return out;
}

nlohmann::ordered_json labelled(const UnlabeledRecord& r, const std::string& answer) {
    nlohmann::ordered_json j = r.json;
    if (r.ex.chat())
        j["messages"].push_back({{"role", "assistant"}, {"content", answer}});
    else
        j["output"] = answer;
    return j;
}

const char* reason_name(LabelReason r) {
    switch (r) {
        case LabelReason::Kept:
            return "kept";
        case LabelReason::Unfinished:
            return "unfinished";
        case LabelReason::Rejected:
            return "rejected";
        case LabelReason::LowAgreement:
            return "low_agreement";
        case LabelReason::LowLogprob:
            return "low_logprob";
    }
    return "?";
}

Vote vote(const std::vector<Candidate>& c, const VoteOptions& o) {
    Vote v;
    v.samples = int(c.size());
    struct Group {
        int votes = 0;
        double logprob = 0;
        size_t first = 0;
    };
    std::map<std::string, Group> groups;
    bool any_finished = false;
    for (size_t i = 0; i < c.size(); i++) {
        any_finished |= c[i].finished;
        if (!c[i].valid()) continue;
        v.valid++;
        auto [it, fresh] = groups.try_emplace(c[i].text);
        if (fresh) it->second.first = i;
        it->second.votes++;
        it->second.logprob += c[i].logprob;
    }
    if (groups.empty()) {
        v.reason = any_finished ? LabelReason::Rejected : LabelReason::Unfinished;
        return v;
    }
    const auto better = [](const Group& a, const Group& b) {  // a before b
        const double la = a.logprob / a.votes, lb = b.logprob / b.votes;
        if (a.votes != b.votes) return a.votes > b.votes;
        if (la != lb) return la > lb;
        return a.first < b.first;
    };
    auto best = groups.begin();
    for (auto it = groups.begin(); it != groups.end(); ++it)
        if (better(it->second, best->second)) best = it;
    v.answer = best->first;
    v.votes = best->second.votes;
    v.logprob = best->second.logprob / best->second.votes;
    v.agreement = double(v.votes) / std::max(1, v.samples);
    if (v.agreement < o.min_agreement)
        v.reason = LabelReason::LowAgreement;
    else if (v.logprob < o.min_logprob)
        v.reason = LabelReason::LowLogprob;
    return v;
}

AnswerChecker::AnswerChecker(const std::string& spec) : spec_(spec) {
    if (spec.starts_with("regex:")) {
        regex_ = std::make_unique<RegexSplit>(spec.substr(6), fmt::format("--verify {}: the pattern", spec));
        return;
    }
    ANVIL_CHECK(
        spec.starts_with("cmd:") && spec.size() > 4,
        "--verify {}: use regex:PATTERN (the answer must contain a match) or cmd:PROGRAM (exit status 0 "
        "accepts)",
        spec);
    program_ = spec.substr(4);
}

AnswerChecker::~AnswerChecker() = default;

void AnswerChecker::check(const std::vector<UnlabeledRecord>& recs,
                          std::vector<std::vector<Candidate>>& cands, int jobs,
                          const std::function<void(size_t)>& progress) const {
    ANVIL_ASSERT(recs.size() == cands.size());
    // each record's distinct answers once; a verdict applies to every sample that gave the answer
    struct Item {
        size_t rec;
        std::string answer;
        bool accepted = false;
    };
    std::vector<Item> items;
    std::vector<size_t> first_item(recs.size() + 1);
    for (size_t i = 0; i < recs.size(); i++) {
        first_item[i] = items.size();
        std::vector<std::string> seen;
        for (const Candidate& c : cands[i])
            if (c.finished && !c.text.empty() && std::find(seen.begin(), seen.end(), c.text) == seen.end()) {
                seen.push_back(c.text);
                items.push_back({i, c.text});
            }
    }
    first_item[recs.size()] = items.size();
    std::atomic<size_t> next{0}, records_done{0};
    // answers of each record not yet checked: a record is done when its last one is (in any order)
    std::vector<std::atomic<size_t>> left(recs.size());
    for (size_t i = 0; i < recs.size(); i++) left[i] = first_item[i + 1] - first_item[i];
    std::mutex m;
    std::string error;
    const auto work = [&] {
        for (size_t k; (k = next++) < items.size();) {
            {
                std::lock_guard<std::mutex> lk(m);
                if (!error.empty()) return;
            }
            Item& it = items[k];
            if (regex_) {
                it.accepted = regex_->search(it.answer);
            } else {
                const std::string line = json_text(labelled(recs[it.rec], it.answer)) + "\n";
                const ProcessResult r = run_with_input(program_, line);
                if (!r.exited() || r.exit_code == 126 || r.exit_code == 127) {
                    std::lock_guard<std::mutex> lk(m);
                    if (error.empty())
                        error = fmt::format(
                            "--verify {}: the checker {} on the record of line {}; a checker must exit 0 to "
                            "accept and another status to reject",
                            spec_,
                            r.exited() ? fmt::format("could not run ({})", r.describe()) : r.describe(),
                            recs[it.rec].line);
                    return;
                }
                it.accepted = r.exit_code == 0;
            }
            if (--left[it.rec] == 0 && progress) {
                std::lock_guard<std::mutex> lk(m);  // one progress line at a time
                progress(++records_done);
            }
        }
    };
    const int n = std::max(1, std::min<int>(jobs, int(items.size())));
    std::vector<std::thread> pool;
    for (int t = 1; t < n; t++) pool.emplace_back(work);
    work();
    for (std::thread& t : pool) t.join();
    ANVIL_CHECK(error.empty(), "{}", error);
    for (size_t i = 0; i < recs.size(); i++)
        for (Candidate& c : cands[i]) {
            c.accepted = false;
            for (size_t k = first_item[i]; k < first_item[i + 1]; k++)
                if (items[k].answer == c.text) c.accepted = items[k].accepted;
        }
}

}  // namespace anvil
