#include "data/synthetic.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <string>

#include "core/rng.h"

namespace anvil {

namespace {
std::string random_word(Rng& rng, int min_len, int max_len) {
    const int len = min_len + int(rng.below(uint64_t(max_len - min_len + 1)));
    std::string w;
    for (int i = 0; i < len; i++) w.push_back(char('a' + rng.below(26)));
    return w;
}
}  // namespace

std::vector<Example> synthetic_examples(int n, uint64_t seed) {
    Rng rng(seed);
    std::vector<Example> out;
    out.reserve(size_t(n));
    std::set<std::pair<int, std::string>> seen;  // no input twice per task: held-out examples are unseen
    while (int(out.size()) < n) {
        const int task = int(rng.below(3));
        Example e;
        e.input = random_word(rng, 3, 7);
        if (!seen.insert({task, e.input}).second) continue;
        switch (task) {
            case 0:
                e.instruction = "Reverse.";
                e.output = std::string(e.input.rbegin(), e.input.rend());
                break;
            case 1:
                e.instruction = "Sort.";
                e.output = e.input;
                std::sort(e.output.begin(), e.output.end());
                break;
            default:
                e.instruction = "Uppercase.";
                e.output = e.input;
                for (char& c : e.output) c = char(std::toupper(static_cast<unsigned char>(c)));
                break;
        }
        out.push_back(std::move(e));
    }
    return out;
}

}  // namespace anvil
