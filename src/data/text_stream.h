// Generated text shown as its tokens arrive (anvil generate's stream, the server's responses): never half a
// UTF-8 character, never the beginning of a stop string that may still complete, and nothing from a stop
// string on.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace anvil {

// What may be shown so far, and whether a stop string has appeared (the text then ends before it).
class TextStream {
public:
    TextStream(const Tokenizer& tok, std::vector<std::string> stop) : tok_(tok), stop_(std::move(stop)) {}
    // Adds tokens; returns the newly showable text.
    std::string push(const std::vector<int32_t>& ids);
    // The generation ended: the rest (held-back bytes included), unless a stop string cut it.
    std::string finish();
    bool stopped() const { return stopped_; }
    const std::string& text() const { return shown_; }
    int tokens() const { return int(ids_.size()); }
    const std::vector<int32_t>& ids() const { return ids_; }  // every token pushed

private:
    const Tokenizer& tok_;
    std::vector<std::string> stop_;
    std::vector<int32_t> ids_;
    std::string shown_;
    bool stopped_ = false;
};

}  // namespace anvil
