// Near-duplicate detection by MinHash and locality-sensitive hashing (Broder 1997; Leskovec, Rajaraman and
// Ullman, "Mining of Massive Datasets", ch. 3), as datatrove and text-dedup do it: a record is the set of its
// word n-grams (shingles); `bands` x `rows` min-hashes make its signature; two records whose signatures agree
// on every row of some band become a candidate pair, which happens with probability 1 - (1 - s^rows)^bands
// for Jaccard similarity s; each candidate is then verified by its exact Jaccard similarity, so no pair below
// `threshold` is reported.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace anvil {

struct MinHashOptions {
    int ngram = 5;           // words a shingle
    int bands = 20;          // a candidate: one band's rows all equal
    int rows = 5;            // min-hashes a band
    double threshold = 0.8;  // verified: exact Jaccard similarity at least this
    uint64_t seed = 0;       // the hash functions'
};

// A text's shingles: its words (split at whitespace, ASCII letters lowercased) taken `ngram` at a time (a
// shorter text: all its words as one), each hashed to 64 bits; sorted, without repeats.
std::vector<uint64_t> shingles(std::string_view text, int ngram);
// |a ∩ b| / |a ∪ b| of two sorted sets without repeats (1 for two empty sets).
double jaccard(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b);
// The chance that a pair of Jaccard similarity s becomes a candidate.
double candidate_probability(double s, int bands, int rows);

// bands * rows min-hashes of a set: for hash function k, the least of k's hash over the set.
std::vector<uint64_t> minhash_signature(const std::vector<uint64_t>& set, const MinHashOptions& o);
// Whether two signatures share a bucket: agree on every row of some band (compared by the band's key, as the
// index near_duplicates and near_references search compares them).
bool lsh_candidates(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b, const MinHashOptions& o);

struct NearMatch {
    size_t record;  // in the collection searched
    size_t match;   // the earlier record (near_duplicates) or the reference (near_references) it is near
    double jaccard;
};
// Each record that is near an earlier record of the same collection (the first such it is near), in order.
std::vector<NearMatch> near_duplicates(const std::vector<std::vector<uint64_t>>& sets,
                                       const MinHashOptions& o);
// Records met one at a time (`data prepare --near-dedup`): each is checked against the records kept before
// it.
class NearDuplicateIndex {
public:
    explicit NearDuplicateIndex(const MinHashOptions& o);
    ~NearDuplicateIndex();
    // True, with the kept record it is near (`match`: its index among the kept, from 0) and their Jaccard
    // similarity, when `set` is near one; otherwise `set` is kept (indexed) and false returned.
    bool near_or_keep(std::vector<uint64_t> set, NearMatch& m);
    // The two halves: whether `set` is near a kept record (as above, `set` not kept), and keeping it.
    bool near(const std::vector<uint64_t>& set, NearMatch& m) const;
    void keep(std::vector<uint64_t> set);
    size_t size() const;  // records kept

private:
    MinHashOptions o_;
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// Each record near some reference (the first such), in order.
std::vector<NearMatch> near_references(const std::vector<std::vector<uint64_t>>& sets,
                                       const std::vector<std::vector<uint64_t>>& references,
                                       const MinHashOptions& o);

}  // namespace anvil
