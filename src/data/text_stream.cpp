#include "data/text_stream.h"

#include <algorithm>

#include "data/utf8.h"

namespace anvil {

std::string TextStream::push(const std::vector<int32_t>& ids) {
    if (stopped_) return {};
    ids_.insert(ids_.end(), ids.begin(), ids.end());
    const std::string all = tok_.decode(ids_);
    // the earliest stop string ends the text
    size_t cut = std::string::npos;
    for (const std::string& s : stop_) cut = std::min(cut, all.find(s));
    size_t safe;
    if (cut != std::string::npos) {
        stopped_ = true;
        safe = cut;
    } else {
        const size_t end = all.size() - utf8::incomplete_tail(all);
        safe = end;
        // hold back a tail that may grow into a stop string
        for (const std::string& s : stop_)
            for (size_t k = std::min(s.size() - 1, end); k > 0; k--)
                if (all.compare(end - k, k, s, 0, k) == 0) {
                    safe = std::min(safe, end - k);
                    break;
                }
    }
    if (safe <= shown_.size() || all.compare(0, shown_.size(), shown_) != 0) return {};
    std::string delta = all.substr(shown_.size(), safe - shown_.size());
    shown_ += delta;
    return delta;
}

std::string TextStream::finish() {
    if (stopped_) return {};
    const std::string all = tok_.decode(ids_);
    if (all.size() <= shown_.size() || all.compare(0, shown_.size(), shown_) != 0) return {};
    std::string rest = all.substr(shown_.size());
    shown_ = all;
    return rest;
}

}  // namespace anvil
