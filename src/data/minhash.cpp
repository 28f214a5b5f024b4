#include "data/minhash.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>

#include "core/error.h"

namespace anvil {

namespace {

// SplitMix64's finaliser: a bijection of 64-bit values that mixes every bit into every other.
uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Hash function k's key: min-hash k of a set is the least mix64(x ^ key) over it.
uint64_t hash_key(uint64_t seed, int k) {
    return mix64(seed + 0x9e3779b97f4a7c15ull * uint64_t(k + 1));
}

// One band's rows as one bucket key.
uint64_t band_key(const std::vector<uint64_t>& sig, int band, int rows) {
    uint64_t h = mix64(uint64_t(band) + 1);
    for (int r = 0; r < rows; r++) h = mix64(h ^ sig[size_t(band * rows + r)]);
    return h;
}

void check_options(const MinHashOptions& o) {
    ANVIL_CHECK(
        o.ngram > 0 && o.bands > 0 && o.rows > 0 && o.threshold > 0.0 && o.threshold <= 1.0,
        "minhash: --ngram, --bands and --rows must be positive and --threshold in (0, 1] (got {}, {}, "
        "{}, {})",
        o.ngram, o.bands, o.rows, o.threshold);
}

}  // namespace

// Buckets of every band; `find` yields the records sharing a bucket with a signature, `add` files one.
// (Outside the anonymous namespace: NearDuplicateIndex::Impl holds one.)
class LshIndex {
public:
    explicit LshIndex(const MinHashOptions& o) : o_(o), buckets_(size_t(o.bands)) {}
    void add(const std::vector<uint64_t>& sig, size_t id) {
        for (int b = 0; b < o_.bands; b++) buckets_[size_t(b)][band_key(sig, b, o_.rows)].push_back(id);
    }
    // the candidates' ids, sorted, without repeats
    std::vector<size_t> find(const std::vector<uint64_t>& sig) const {
        std::vector<size_t> out;
        for (int b = 0; b < o_.bands; b++) {
            const auto it = buckets_[size_t(b)].find(band_key(sig, b, o_.rows));
            if (it != buckets_[size_t(b)].end()) out.insert(out.end(), it->second.begin(), it->second.end());
        }
        std::sort(out.begin(), out.end());
        out.erase(std::unique(out.begin(), out.end()), out.end());
        return out;
    }

private:
    MinHashOptions o_;
    std::vector<std::unordered_map<uint64_t, std::vector<size_t>>> buckets_;
};

namespace {

// The first candidate whose exact similarity reaches the threshold.
bool first_near(const std::vector<uint64_t>& set, const std::vector<size_t>& candidates,
                const std::vector<std::vector<uint64_t>>& pool, double threshold, NearMatch& m) {
    for (size_t c : candidates) {
        const double s = jaccard(set, pool[c]);
        if (s >= threshold) {
            m.match = c;
            m.jaccard = s;
            return true;
        }
    }
    return false;
}

}  // namespace

std::vector<uint64_t> shingles(std::string_view text, int ngram) {
    std::vector<uint64_t> words;
    uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over a word's bytes
    bool in_word = false;
    for (const char c : text) {
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') {
            if (in_word) words.push_back(mix64(h));
            h = 0xcbf29ce484222325ull;
            in_word = false;
            continue;
        }
        const char l = c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c;
        h = (h ^ uint8_t(l)) * 0x100000001b3ull;
        in_word = true;
    }
    if (in_word) words.push_back(mix64(h));
    std::vector<uint64_t> out;
    const size_t n = std::min(words.size(), size_t(ngram));
    for (size_t i = 0; n > 0 && i + n <= words.size(); i++) {
        uint64_t s = 0;
        for (size_t k = 0; k < n; k++) s = mix64(s ^ words[i + k]);
        out.push_back(s);
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
}

double jaccard(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b) {
    if (a.empty() && b.empty()) return 1.0;
    size_t i = 0, j = 0, both = 0;
    while (i < a.size() && j < b.size()) {
        if (a[i] == b[j]) {
            both++;
            i++;
            j++;
        } else if (a[i] < b[j]) {
            i++;
        } else {
            j++;
        }
    }
    return double(both) / double(a.size() + b.size() - both);
}

double candidate_probability(double s, int bands, int rows) {
    return 1.0 - std::pow(1.0 - std::pow(s, rows), bands);
}

std::vector<uint64_t> minhash_signature(const std::vector<uint64_t>& set, const MinHashOptions& o) {
    std::vector<uint64_t> sig(size_t(o.bands * o.rows), std::numeric_limits<uint64_t>::max());
    for (size_t k = 0; k < sig.size(); k++) {
        const uint64_t key = hash_key(o.seed, int(k));
        for (uint64_t x : set) sig[k] = std::min(sig[k], mix64(x ^ key));
    }
    return sig;
}

bool lsh_candidates(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b, const MinHashOptions& o) {
    for (int band = 0; band < o.bands; band++)  // as LshIndex files them: by the band's key
        if (band_key(a, band, o.rows) == band_key(b, band, o.rows)) return true;
    return false;
}

std::vector<NearMatch> near_duplicates(const std::vector<std::vector<uint64_t>>& sets,
                                       const MinHashOptions& o) {
    check_options(o);
    LshIndex index(o);
    std::vector<NearMatch> out;
    for (size_t i = 0; i < sets.size(); i++) {
        const std::vector<uint64_t> sig = minhash_signature(sets[i], o);
        NearMatch m{i, 0, 0.0};
        if (first_near(sets[i], index.find(sig), sets, o.threshold, m)) out.push_back(m);
        index.add(sig, i);
    }
    return out;
}

struct NearDuplicateIndex::Impl {
    explicit Impl(const MinHashOptions& o) : index(o) {}
    LshIndex index;
    std::vector<std::vector<uint64_t>> kept;
};

NearDuplicateIndex::NearDuplicateIndex(const MinHashOptions& o) : o_(o) {
    check_options(o);
    impl_ = std::make_unique<Impl>(o);
}

NearDuplicateIndex::~NearDuplicateIndex() = default;

bool NearDuplicateIndex::near(const std::vector<uint64_t>& set, NearMatch& m) const {
    return first_near(set, impl_->index.find(minhash_signature(set, o_)), impl_->kept, o_.threshold, m);
}

void NearDuplicateIndex::keep(std::vector<uint64_t> set) {
    impl_->index.add(minhash_signature(set, o_), impl_->kept.size());
    impl_->kept.push_back(std::move(set));
}

size_t NearDuplicateIndex::size() const {
    return impl_->kept.size();
}

bool NearDuplicateIndex::near_or_keep(std::vector<uint64_t> set, NearMatch& m) {
    if (near(set, m)) return true;
    keep(std::move(set));
    return false;
}

std::vector<NearMatch> near_references(const std::vector<std::vector<uint64_t>>& sets,
                                       const std::vector<std::vector<uint64_t>>& references,
                                       const MinHashOptions& o) {
    check_options(o);
    LshIndex index(o);
    for (size_t j = 0; j < references.size(); j++) index.add(minhash_signature(references[j], o), j);
    std::vector<NearMatch> out;
    for (size_t i = 0; i < sets.size(); i++) {
        NearMatch m{i, 0, 0.0};
        if (first_near(sets[i], index.find(minhash_signature(sets[i], o)), references, o.threshold, m))
            out.push_back(m);
    }
    return out;
}

}  // namespace anvil
