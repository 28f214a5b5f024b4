// Pseudo-labelling (`anvil data pseudo-label`, as rejection-sampling fine-tuning and STaR do it): records
// without answers, the answers sampled for them, a checker's verdict on each, and the vote that keeps a
// record with its majority answer or says why not. Sampling the answers is the command's (cli/cmd_label.cpp,
// on the serving scheduler); everything here is plain data.
#pragma once

#include <cstddef>
#include <functional>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/chat.h"
#include "data/regex_split.h"

namespace anvil {

// A record to label: an instruction record without "output" (or with null or ""), or a chat whose last
// message is the user's.
struct UnlabeledRecord {
    size_t line = 0;              // in its file, from 1
    nlohmann::ordered_json json;  // as read; labelled() adds the answer and keeps every other field
    Example ex;                   // its prompt
};
// The records of a JSONL file. A record that already has an answer, one that is not an instruction or chat
// record, or no record at all is an error naming the file and the line.
std::vector<UnlabeledRecord> read_unlabeled(const std::string& path);
// The record with `answer` as its "output", or as a final assistant message.
nlohmann::ordered_json labelled(const UnlabeledRecord& r, const std::string& answer);

struct Candidate {
    std::string text;      // the sampled answer, the end-of-turn token left out
    double logprob = 0.0;  // mean log-probability of its tokens under the model (natural log)
    bool finished = true;  // it ended with an end-of-turn token (not cut off at the token limit)
    bool accepted = true;  // the checker's verdict (true where there is none)
    bool valid() const { return finished && accepted && !text.empty(); }
};

// Why a record is kept or not, in the order the vote tests them.
enum class LabelReason : uint8_t {
    Kept,
    Unfinished,    // no sample ended within the token limit
    Rejected,      // no finished, non-empty sample passed the checker
    LowAgreement,  // the majority answer's share of the samples is below --min-agreement
    LowLogprob,    // its mean log-probability is below --min-logprob
};
const char* reason_name(LabelReason r);  // "kept", "unfinished", "rejected", "low_agreement", "low_logprob"

struct VoteOptions {
    double min_agreement = 0.0;  // the majority's share of all samples
    double min_logprob = -std::numeric_limits<double>::infinity();
};
struct Vote {
    LabelReason reason = LabelReason::Kept;
    std::string answer;    // the majority answer among the valid samples ("" when none)
    int votes = 0;         // samples that gave it
    int samples = 0;       // all samples
    int valid = 0;         // finished, accepted, non-empty ones
    double agreement = 0;  // votes / samples
    double logprob = 0;    // the mean of its samples' log-probabilities
};
// The majority answer among the valid candidates (most votes; a tie to the higher log-probability, then to
// the first drawn), and whether it is kept.
Vote vote(const std::vector<Candidate>& c, const VoteOptions& o);

// --verify: "regex:PATTERN" accepts an answer that contains a match (PCRE2; ^...$ for the whole answer);
// "cmd:PROGRAM" runs PROGRAM (with /bin/sh -c) once per distinct answer of a record, the record with that
// answer (labelled()) as one JSON line on its standard input: exit status 0 accepts, any other exit status
// rejects, and a program that cannot run (status 126 or 127) or dies by a signal is an error naming it and
// the record's line.
class AnswerChecker {
public:
    explicit AnswerChecker(const std::string& spec);  // throws naming --verify for a bad spec
    ~AnswerChecker();
    // Sets `accepted` on every candidate of every record (cands[i] belongs to recs[i]), `jobs` programs at a
    // time; `progress` (may be empty) gets the number of records done.
    void check(const std::vector<UnlabeledRecord>& recs, std::vector<std::vector<Candidate>>& cands, int jobs,
               const std::function<void(size_t)>& progress = {}) const;
    const std::string& spec() const { return spec_; }

private:
    std::string spec_, program_;
    std::unique_ptr<RegexSplit> regex_;
};

}  // namespace anvil
