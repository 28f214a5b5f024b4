#include "data/augment.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include <fmt/format.h>

#include "core/error.h"
#include "core/text.h"
#include "io/fs.h"

namespace anvil {

namespace {

constexpr const char* kOpNames[] = {"swap", "delete", "insert", "synonym", "case", "space"};

bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

// A text's words and the gaps before, between and after them, so that the text is rebuilt as it was
// around the words an operation touches.
struct Words {
    std::vector<std::string> words, gaps;  // gaps.size() == words.size() + 1
    explicit Words(std::string_view t) {
        std::string gap, w;
        for (const char c : t) {
            if (is_space(c)) {
                if (!w.empty())
                    words.push_back(std::move(w)), gaps.push_back(std::move(gap)), w.clear(), gap.clear();
                gap += c;
            } else {
                w += c;
            }
        }
        if (!w.empty()) words.push_back(std::move(w)), gaps.push_back(std::move(gap)), gap.clear();
        gaps.push_back(std::move(gap));
    }
    std::string text() const {
        std::string s = gaps[0];
        for (size_t i = 0; i < words.size(); i++) s += words[i] + gaps[i + 1];
        return s;
    }
};

// A word's core (letters and digits between its leading and trailing punctuation).
struct Core {
    size_t begin, end;
};
Core core_of(const std::string& w) {
    size_t a = 0, b = w.size();
    while (a < b && std::ispunct(static_cast<unsigned char>(w[a]))) a++;
    while (b > a && std::ispunct(static_cast<unsigned char>(w[b - 1]))) b--;
    return {a, b};
}

// `repl` in `w`'s place, `w`'s punctuation and capitalization kept.
std::string replace_core(const std::string& w, std::string repl) {
    const Core c = core_of(w);
    const std::string core = w.substr(c.begin, c.end - c.begin);
    const bool all_caps =
        core.size() > 1 &&
        std::all_of(core.begin(), core.end(),
                    [](char ch) { return !std::islower(static_cast<unsigned char>(ch)); }) &&
        std::any_of(core.begin(), core.end(),
                    [](char ch) { return std::isupper(static_cast<unsigned char>(ch)); });
    if (all_caps)
        for (char& ch : repl) ch = char(std::toupper(static_cast<unsigned char>(ch)));
    else if (!core.empty() && std::isupper(static_cast<unsigned char>(core[0])) && !repl.empty())
        repl[0] = char(std::toupper(static_cast<unsigned char>(repl[0])));
    return w.substr(0, c.begin) + repl + w.substr(c.end);
}

const std::vector<std::string>* synonyms_of(const Synonyms* s, const std::string& w) {
    if (!s) return nullptr;
    const Core c = core_of(w);
    return s->of(ascii_lower(std::string_view(w).substr(c.begin, c.end - c.begin)));
}

size_t changes(double p, size_t words) {
    return std::max<size_t>(1, size_t(std::llround(p * double(words))));
}

void apply(Words& t, AugmentOp op, double p, const Synonyms* syn, Rng& rng) {
    const size_t n = t.words.size(), k = changes(p, n);
    switch (op) {
        case AugmentOp::Swap:
            for (size_t i = 0; i < k && n >= 2; i++) std::swap(t.words[rng.below(n)], t.words[rng.below(n)]);
            break;
        case AugmentOp::Delete: {  // each word with chance p, never all of them, never one the list names
            std::vector<bool> drop(n);
            size_t dropped = 0;
            for (size_t i = 0; i < n; i++)
                dropped += (drop[i] = rng.uniform() < p && !synonyms_of(syn, t.words[i]));
            if (dropped == n) drop[rng.below(n)] = false;
            Words out("");
            out.gaps[0] = t.gaps[0];
            for (size_t i = 0; i < n; i++)
                if (!drop[i]) out.words.push_back(t.words[i]), out.gaps.push_back(t.gaps[i + 1]);
            out.gaps.back() = t.gaps.back();
            t = std::move(out);
            break;
        }
        case AugmentOp::Insert:
            for (size_t i = 0; i < k; i++) {
                const std::string& from = t.words[rng.below(t.words.size())];
                const std::vector<std::string>* s = synonyms_of(syn, from);
                const Core c = core_of(from);
                std::string w =
                    s ? (*s)[rng.below(s->size())] : ascii_lower(from.substr(c.begin, c.end - c.begin));
                if (w.empty()) continue;
                const size_t m = t.words.size(), at = rng.below(m + 1);
                // before word `at`: gap, new word, " ", the word; at the end: " ", new word, trailing gap
                t.gaps.insert(t.gaps.begin() + long(at < m ? at + 1 : m), " ");
                t.words.insert(t.words.begin() + long(at), std::move(w));
            }
            break;
        case AugmentOp::Synonym: {  // up to k of the words that have synonyms, in random order
            std::vector<size_t> have;
            for (size_t i = 0; i < n; i++)
                if (synonyms_of(syn, t.words[i])) have.push_back(i);
            for (size_t i = 0; i < std::min(k, have.size()); i++) {
                std::swap(have[i], have[i + rng.below(have.size() - i)]);
                const std::vector<std::string>& s = *synonyms_of(syn, t.words[have[i]]);
                t.words[have[i]] = replace_core(t.words[have[i]], s[rng.below(s.size())]);
            }
            break;
        }
        case AugmentOp::Case:
            for (size_t i = 0; i < k; i++) {
                std::string& w = t.words[rng.below(n)];
                const uint64_t how = rng.below(3);
                for (size_t j = 0; j < w.size(); j++) {
                    const unsigned char c = static_cast<unsigned char>(w[j]);
                    w[j] = char(how == 1 || (how == 2 && j == 0) ? std::toupper(c) : std::tolower(c));
                }
            }
            break;
        case AugmentOp::Space:
            for (size_t i = 0; i < k; i++) {
                t.gaps[rng.below(t.gaps.size())] += ' ';  // the ends too
            }
            break;
    }
}

}  // namespace

const char* augment_op_name(AugmentOp op) {
    return kOpNames[size_t(op)];
}

std::vector<std::string> split_commas(const std::string& spec) {
    std::vector<std::string> out;
    for (size_t pos = 0; pos <= spec.size();) {
        const size_t comma = std::min(spec.find(',', pos), spec.size());
        out.push_back(trim(std::string_view(spec).substr(pos, comma - pos)));
        pos = comma + 1;
    }
    return out;
}

std::vector<AugmentOp> parse_augment_ops(const std::string& spec, const char* flag) {
    std::vector<AugmentOp> ops;
    for (const std::string& name : split_commas(spec)) {
        const auto it =
            std::find_if(std::begin(kOpNames), std::end(kOpNames), [&](const char* n) { return name == n; });
        ANVIL_CHECK(it != std::end(kOpNames),
                    "{} {}: unknown operation \"{}\"; use swap, delete, insert, synonym, case, space", flag,
                    spec, name);
        const AugmentOp op = AugmentOp(it - std::begin(kOpNames));
        if (std::find(ops.begin(), ops.end(), op) == ops.end()) ops.push_back(op);
    }
    return ops;
}

Synonyms Synonyms::read(const std::string& path) {
    Synonyms s;
    read_lines(path, [&](const std::string& line, size_t lineno) {
        const std::string t = trim(line);
        if (t.empty() || t[0] == '#') return;
        std::vector<std::string> group = split_commas(ascii_lower(t));
        for (const std::string& w : group)
            ANVIL_CHECK(!w.empty(), "{} line {}: an empty word; separate a group's words by single commas",
                        path, lineno);
        ANVIL_CHECK(group.size() >= 2, "{} line {}: a group needs two words or more, comma-separated", path,
                    lineno);
        s.add_group(group);
    });
    ANVIL_CHECK(!s.empty(), "{}: no synonym groups in it (one group a line, words comma-separated)", path);
    return s;
}

void Synonyms::add_group(const std::vector<std::string>& words) {
    for (const std::string& w : words) {
        std::vector<std::string>& list = table_[ascii_lower(w)];
        for (const std::string& other : words)
            if (ascii_lower(other) != ascii_lower(w) &&
                std::find(list.begin(), list.end(), ascii_lower(other)) == list.end())
                list.push_back(ascii_lower(other));
    }
}

const std::vector<std::string>* Synonyms::of(std::string_view word) const {
    const auto it = table_.find(std::string(word));
    return it == table_.end() || it->second.empty() ? nullptr : &it->second;
}

void check_augment_options(const AugmentOptions& o, const char* flag, const char* fields_flag) {
    for (const std::string& f : o.fields)
        ANVIL_CHECK(f == "instruction" || f == "input" || f == "system" || f == "user",
                    "{}: field \"{}\"; augment instruction, input, system or user (fields that do not decide "
                    "the answer)",
                    fields_flag, f);
    const bool wants = std::find(o.ops.begin(), o.ops.end(), AugmentOp::Synonym) != o.ops.end();
    ANVIL_CHECK(!wants || o.synonyms, "{}: the synonym operation needs a word list; pass --synonyms FILE",
                flag);
    ANVIL_CHECK(o.p > 0 && o.p <= 1, "{}: the share of words changed must be in (0, 1], not {}", flag, o.p);
}

std::string augment_text(std::string_view text, AugmentOp op, double p, const Synonyms* synonyms, Rng& rng) {
    Words t(text);
    if (t.words.empty()) return std::string(text);
    apply(t, op, p, synonyms, rng);
    return t.text();
}

std::vector<std::string*> chosen_fields(Example& e, const std::vector<std::string>& fields) {
    const auto wanted = [&](const char* f) {
        return std::find(fields.begin(), fields.end(), f) != fields.end();
    };
    std::vector<std::string*> out;
    if (!e.chat()) {
        if (wanted("instruction")) out.push_back(&e.instruction);
        if (wanted("input") && !e.input.empty()) out.push_back(&e.input);
        return out;
    }
    for (Message& m : e.messages)
        if ((m.role == Role::System && wanted("system")) || (m.role == Role::User && wanted("user")))
            out.push_back(&m.content);
    return out;
}

void augment_fields(Example& e, AugmentOp op, const AugmentOptions& o, Rng& rng) {
    for (std::string* f : chosen_fields(e, o.fields)) *f = augment_text(*f, op, o.p, o.synonyms.get(), rng);
}

AugmentOp augment_example(Example& e, const AugmentOptions& o, Rng& rng) {
    const AugmentOp op = o.ops[rng.below(o.ops.size())];
    augment_fields(e, op, o, rng);
    return op;
}

uint64_t augmentation_seed(uint64_t seed, uint64_t epoch, uint64_t record) {
    uint64_t z = seed * 0x9e3779b97f4a7c15ull ^ (epoch + 1) * 0xd1b54a32d192ed03ull;
    z = (z ^ (z >> 31)) * 0x7fb5d329728ea185ull ^ (record + 1) * 0x94d049bb133111ebull;
    z = (z ^ (z >> 27)) * 0x81dadef4bc2dd44dull;
    return z ^ (z >> 33);
}

bool RecordAugmenter::augmented(size_t k, uint64_t epoch, TokenStream& out) const {
    const Example& e = examples[k];
    if (!e.chat() && e.instruction.empty()) return false;  // a text record
    Rng rng(augmentation_seed(seed, epoch, k));
    if (rng.uniform() >= prob) return false;
    Example a = e;
    augment_example(a, opts, rng);
    if (!template_problem(a, prompt, *tok).empty()) return false;  // as it was, where the copy cannot render
    out = record_tokens(a, prompt, *tok);
    return true;
}

}  // namespace anvil
