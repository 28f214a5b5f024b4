// Byte-level BPE training: count GPT-2 pre-tokenizer pieces, then repeatedly merge the most frequent adjacent
// pair (ties: the smaller (left, right) id pair), updating pair counts incrementally in the words that hold
// the pair. Ids 0..255 are the bytes, then one id per merge, then <|endoftext|>.
#include <algorithm>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "core/progress.h"
#include "data/bpe.h"
#include "data/pretokenize.h"
#include "data/utf8.h"

namespace anvil {

namespace {
uint64_t key(int32_t a, int32_t b) {
    return uint64_t(uint32_t(a)) << 32 | uint32_t(b);
}
struct Word {
    std::vector<int32_t> sym;
    int64_t count;
};

// The texts' pre-tokenized pieces as byte sequences with their counts, in a fixed order (not the hash map's).
std::vector<Word> count_words(const std::vector<std::string>& texts) {
    std::unordered_map<std::string, int64_t> pieces;
    std::vector<uint32_t> ends;
    for (const std::string& raw : texts) {
        const std::string text = utf8::valid(raw) ? raw : utf8::repair(raw);
        ends.clear();
        gpt2_pretokenize(text, ends);
        uint32_t start = 0;
        for (uint32_t e : ends) {
            pieces[text.substr(start, e - start)]++;
            start = e;
        }
    }
    std::vector<Word> words;
    words.reserve(pieces.size());
    for (const auto& [p, c] : pieces) {
        Word w{{}, c};
        for (char ch : p) w.sym.push_back(int32_t(uint8_t(ch)));
        words.push_back(std::move(w));
    }
    std::sort(words.begin(), words.end(), [](const Word& a, const Word& b) { return a.sym < b.sym; });
    return words;
}

// The pair (a, b) (its key k) merged into `id` everywhere in w, the pair counts' changes added to `delta`.
void merge_in_word(Word& w, int32_t a, int32_t b, int32_t id, uint64_t k,
                   std::unordered_map<uint64_t, int64_t>& delta) {
    auto& s = w.sym;
    const int64_t n = w.count;
    std::vector<int32_t> out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
            if (!out.empty()) {
                delta[key(out.back(), a)] -= n;
                delta[key(out.back(), id)] += n;
            }
            if (i + 2 < s.size()) {
                delta[key(b, s[i + 2])] -= n;
                delta[key(id, s[i + 2])] += n;
            }
            delta[k] -= n;
            out.push_back(id);
            i += 2;
        } else {
            out.push_back(s[i]);
            i++;
        }
    }
    s = std::move(out);
}

}  // namespace

BpeTokenizer train_bpe(const std::vector<std::string>& texts, int vocab_size, bool show_progress) {
    ANVIL_CHECK(vocab_size >= 257,
                "--vocab-size {}: a byte-level BPE needs at least 257 ids (256 bytes and "
                "<|endoftext|>)",
                vocab_size);
    // 1. pieces and their counts
    std::vector<Word> words = count_words(texts);
    // 2. pair counts and where each pair occurs
    std::unordered_map<uint64_t, int64_t> counts;
    std::unordered_map<uint64_t, std::unordered_set<uint32_t>> where;
    for (uint32_t w = 0; w < words.size(); w++)
        for (size_t i = 0; i + 1 < words[w].sym.size(); i++) {
            const uint64_t k = key(words[w].sym[i], words[w].sym[i + 1]);
            counts[k] += words[w].count;
            where[k].insert(w);
        }
    using Entry = std::pair<int64_t, uint64_t>;  // count, -key order via comparator
    auto cmp = [](const Entry& x, const Entry& y) {
        return x.first != y.first ? x.first < y.first : x.second > y.second;
    };
    std::priority_queue<Entry, std::vector<Entry>, decltype(cmp)> heap(cmp);
    for (const auto& [k, c] : counts) heap.push({c, k});

    // 3. the most frequent pair merged, again and again
    std::vector<std::string> tokens(256);
    for (int b = 0; b < 256; b++) tokens[size_t(b)] = std::string(1, char(b));
    std::vector<std::pair<int32_t, int32_t>> merges;
    const int target = vocab_size - 1 - 256;  // merges to make (one id is <|endoftext|>)
    Progress bar("bpe merges", target, std::max(1, target / 20), "merges");
    while (int(merges.size()) < target && !heap.empty()) {
        const auto [c, k] = heap.top();
        heap.pop();
        const auto it = counts.find(k);
        if (it == counts.end() || it->second != c) continue;  // stale
        if (c < 1) break;
        const int32_t a = int32_t(k >> 32), b = int32_t(uint32_t(k)), id = int32_t(tokens.size());
        tokens.push_back(tokens[size_t(a)] + tokens[size_t(b)]);
        merges.push_back({a, b});
        std::unordered_map<uint64_t, int64_t> delta;
        for (uint32_t w : where[k]) {
            merge_in_word(words[w], a, b, id, k, delta);
            const auto& s = words[w].sym;
            for (size_t i = 0; i + 1 < s.size(); i++)
                if (s[i] == id || s[i + 1] == id) where[key(s[i], s[i + 1])].insert(w);
        }
        for (const auto& [pk, d] : delta) {
            if (d == 0) continue;
            const int64_t now = counts[pk] += d;
            if (now > 0) heap.push({now, pk});
        }
        counts.erase(k);
        where.erase(k);
        if (show_progress) bar.update(int64_t(merges.size()), fmt::format("{} ids", tokens.size()));
    }
    if (show_progress) bar.finish(fmt::format("{} merges, vocabulary {}", merges.size(), tokens.size() + 1));
    const int32_t eot = int32_t(tokens.size());
    tokens.emplace_back(kEndOfText);
    return BpeTokenizer(std::move(tokens), merges, {{std::string(kEndOfText), eot}}, "trained");
}

}  // namespace anvil
