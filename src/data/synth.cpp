#include "data/synth.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "core/error.h"
#include "data/utf8.h"

namespace anvil {

std::vector<std::string> rouge_words(std::string_view text) {
    std::vector<std::string> out;
    std::string w;
    for (const char ch : text) {
        const unsigned char c = static_cast<unsigned char>(ch);
        if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || c >= 0x80) {
            w += ch;
        } else if (c >= 'A' && c <= 'Z') {
            w += char(c - 'A' + 'a');
        } else if (!w.empty()) {
            out.push_back(std::move(w));
            w.clear();
        }
    }
    if (!w.empty()) out.push_back(std::move(w));
    return out;
}

namespace {

template <class T>
size_t lcs(const std::vector<T>& a, const std::vector<T>& b) {
    std::vector<size_t> row(b.size() + 1, 0);  // row[j]: LCS of a[0, i) and b[0, j)
    for (size_t i = 0; i < a.size(); i++) {
        size_t diag = 0;  // row[j - 1] of the previous i
        for (size_t j = 0; j < b.size(); j++) {
            const size_t up = row[j + 1];
            row[j + 1] = a[i] == b[j] ? diag + 1 : std::max(up, row[j]);
            diag = up;
        }
    }
    return row[b.size()];
}

double f_measure(size_t common, size_t la, size_t lb) {
    return la == 0 || lb == 0 ? 0.0 : 2.0 * double(common) / double(la + lb);
}

size_t word_count(const std::string& s) {
    size_t n = 0;
    bool in = false;
    for (const char c : s) {
        const bool space = c == ' ' || c == '\t' || c == '\n' || c == '\r';
        n += !space && !in;
        in = !space;
    }
    return n;
}

}  // namespace

double rouge_l(const std::vector<std::string>& a, const std::vector<std::string>& b) {
    return f_measure(lcs(a, b), a.size(), b.size());
}

std::string self_instruct_prompt(const std::vector<std::string>& tasks) {
    std::string s = "Come up with a series of tasks:\n\n";
    for (size_t i = 0; i < tasks.size(); i++) {
        std::string t = tasks[i];
        std::replace(t.begin(), t.end(), '\n', ' ');  // a task a line
        s += fmt::format("Task {}: {}\n", i + 1, t);
    }
    return s + fmt::format("Task {}:", tasks.size() + 1);
}

std::vector<std::string> draw_tasks(const std::vector<std::string>& seeds,
                                    const std::vector<std::string>& generated, int n, int from_generated,
                                    Rng& rng) {
    const auto pick = [&](const std::vector<std::string>& pool, size_t k, std::vector<std::string>& out) {
        std::vector<size_t> idx(pool.size());
        for (size_t i = 0; i < idx.size(); i++) idx[i] = i;
        for (size_t i = 0; i < std::min(k, idx.size()); i++) {  // a partial Fisher-Yates shuffle
            std::swap(idx[i], idx[i + size_t(rng.next_u64() % uint64_t(idx.size() - i))]);
            out.push_back(pool[idx[i]]);
        }
    };
    std::vector<std::string> out;
    pick(generated, size_t(std::min(from_generated, n)), out);
    pick(seeds, size_t(n) - out.size(), out);
    for (size_t i = out.size(); i > 1; i--) std::swap(out[i - 1], out[size_t(rng.next_u64() % i)]);
    return out;
}

const char* synth_reason_name(SynthReason r) {
    static const char* const names[kSynthReasons] = {"kept",    "unfinished",     "malformed",
                                                     "length",  "leak",           "duplicate",
                                                     "similar", "near_duplicate", "no_answer"};
    return names[size_t(r)];
}

bool well_formed(std::string_view text) {
    for (const char c : text)
        if ((static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n') || c == 0x7f) return false;
    return utf8::valid(text);
}

// Questions indexed three ways: their words joined (exact duplicates), by word for ROUGE-L (a text can reach
// the bound only through shared words, so LCS is computed only where 2 shared / (|a| + |b|) reaches it), and
// by MinHash.
struct SynthFilter::Pool {
    explicit Pool(const MinHashOptions& o) : near(o), ngram(o.ngram) {}
    std::unordered_map<std::string, size_t> exact;
    std::unordered_map<std::string, int32_t> ids;  // word -> id
    std::vector<std::vector<int32_t>> texts;
    std::vector<std::vector<std::pair<size_t, int32_t>>> postings;  // word id -> (text, times it appears)
    std::vector<std::string> where;
    NearDuplicateIndex near;
    int ngram;

    std::vector<int32_t> encode(const std::vector<std::string>& words, bool add) {
        std::vector<int32_t> out;
        for (const std::string& w : words) {
            auto it = ids.find(w);
            if (it == ids.end() && !add) {
                out.push_back(-1);  // a word no indexed text has
                continue;
            }
            if (it == ids.end()) it = ids.emplace(w, int32_t(ids.size())).first, postings.emplace_back();
            out.push_back(it->second);
        }
        return out;
    }
    void add(const std::string& q, std::string label) {
        const std::vector<std::string> words = rouge_words(q);
        std::string key;
        for (const std::string& w : words) key += w + " ";
        exact.emplace(key, where.size());
        std::vector<int32_t> enc = encode(words, true);
        std::unordered_map<int32_t, int32_t> count;
        for (int32_t id : enc) count[id]++;
        for (const auto& [id, c] : count) postings[size_t(id)].push_back({texts.size(), c});
        texts.push_back(std::move(enc));
        where.push_back(std::move(label));
        near.keep(shingles(q, ngram));
    }
    const std::string* same_words(const std::string& q) const {
        std::string key;
        for (const std::string& w : rouge_words(q)) key += w + " ";
        const auto it = exact.find(key);
        return it == exact.end() ? nullptr : &where[it->second];
    }
    // The indexed text of the highest ROUGE-L with `q` at least `floor` (its index, score), or score 0.
    std::pair<size_t, double> similar(const std::string& q, double floor) {
        const std::vector<int32_t> enc = encode(rouge_words(q), false);
        std::unordered_map<int32_t, int32_t> count;
        for (int32_t id : enc)
            if (id >= 0) count[id]++;
        std::unordered_map<size_t, size_t> shared;  // text -> words in common, counted with repeats
        for (const auto& [id, c] : count)
            for (const auto& [t, tc] : postings[size_t(id)]) shared[t] += size_t(std::min(c, tc));
        std::pair<size_t, double> best{0, 0.0};
        for (const auto& [t, s] : shared) {
            if (f_measure(s, enc.size(), texts[t].size()) < floor) continue;
            const double f = f_measure(lcs(enc, texts[t]), enc.size(), texts[t].size());
            if (f >= floor && (f > best.second || (f == best.second && t < best.first))) best = {t, f};
        }
        return best;
    }
};

SynthFilter::SynthFilter(const SynthFilterOptions& o)
    : o_(o), kept_(std::make_unique<Pool>(o.near)), held_(std::make_unique<Pool>(o.near)) {}

SynthFilter::~SynthFilter() = default;

void SynthFilter::add_seed(const std::string& question, size_t line) {
    kept_->add(question, fmt::format("seed {}", line));
}

void SynthFilter::add_held_out(const std::string& question, std::string where) {
    held_->add(question, std::move(where));
}

void SynthFilter::keep(const std::string& question, std::string label) {
    kept_->add(question, std::move(label));
}

SynthVerdict SynthFilter::check(const std::string& question) const {
    if (!well_formed(question)) return {SynthReason::Malformed, "", 0};
    const size_t words = word_count(question);
    if (words < size_t(o_.min_words) || words > size_t(o_.max_words))
        return {SynthReason::Length, fmt::format("{} words", words), 0};
    for (Pool* p : {held_.get(), kept_.get()}) {
        const SynthReason near_reason = p == held_.get() ? SynthReason::Leak : SynthReason::NearDuplicate;
        const SynthReason rouge_reason = p == held_.get() ? SynthReason::Leak : SynthReason::Similar;
        if (const std::string* w = p->same_words(question))
            return {p == held_.get() ? SynthReason::Leak : SynthReason::Duplicate, *w, 1.0};
        if (const auto [t, f] = p->similar(question, o_.max_rouge); f > 0)
            return {rouge_reason, p->where[t], f};
        NearMatch m{0, 0, 0};
        if (p->near.near(shingles(question, o_.near.ngram), m))
            return {near_reason, p->where[m.match], m.jaccard};
    }
    return {};
}

}  // namespace anvil
