// tokenizer.json in two parts (see tokenizer_json.h): a SAX pass for model.vocab and model.merges, then the
// document with a parser callback that leaves those two out.
#include "data/tokenizer_json.h"

#include "core/error.h"

namespace anvil {

namespace {

using Json = nlohmann::json;

// Collects model.vocab's entries and model.merges' elements, ignoring the rest of the file.
class TablesSax : public nlohmann::json_sax<Json> {
public:
    explicit TablesSax(TokenizerJson& t) : t_(t) {}

    bool null() override { return value(nullptr, nullptr); }
    bool boolean(bool) override { return value(nullptr, nullptr); }
    bool number_integer(number_integer_t v) override {
        const int64_t x = v;
        return value(&x, nullptr);
    }
    bool number_unsigned(number_unsigned_t v) override {
        const int64_t x = v > uint64_t(INT64_MAX) ? -1 : int64_t(v);  // out of range: refused as an id later
        return value(&x, nullptr);
    }
    bool number_float(number_float_t, const string_t&) override { return value(nullptr, nullptr); }
    bool string(string_t& s) override { return value(nullptr, &s); }
    bool binary(binary_t&) override { return value(nullptr, nullptr); }
    bool start_object(std::size_t) override { return open(true); }
    bool end_object() override { return close(); }
    bool start_array(std::size_t) override { return open(false); }
    bool end_array() override { return close(); }
    bool key(string_t& k) override {
        stack_.back().key = k;
        return true;
    }
    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
        error_ = e.what();
        return false;
    }
    const std::string& error() const { return error_; }

private:
    struct Frame {
        bool object;
        std::string key;  // an object's current member
    };
    // where the innermost container is: model.vocab's object, model.merges' array, or a pair inside it
    bool at_model_member(const char* name) const {
        return stack_.size() == 2 && stack_[0].object && stack_[0].key == "model" && stack_[1].object &&
               stack_[1].key == name;
    }
    bool in_vocab() const { return stack_.size() == 3 && vocab_open_; }
    bool in_merges() const { return stack_.size() == 3 && merges_open_; }
    bool in_pair() const { return stack_.size() == 4 && merges_open_; }

    // the first malformed merge: "merge N: WHAT"
    void bad_merge(const std::string& what) {
        if (t_.merges_bad.empty()) t_.merges_bad = "merge " + std::to_string(count_) + ": " + what;
    }

    bool open(bool object) {
        if (at_model_member("vocab")) {
            t_.has_vocab = true, t_.vocab_object = object;
            vocab_open_ = object;
        } else if (at_model_member("merges")) {
            t_.has_merges = !object;
            merges_open_ = !object;
        } else if (in_merges()) {  // a merge given as a pair
            count_++;
            pair_.clear();
            pair_ok_ = !object;
        } else if (in_pair()) {
            pair_ok_ = false;
        }
        stack_.push_back({object, {}});
        return true;
    }

    bool close() {
        stack_.pop_back();
        if (stack_.size() == 2) {
            vocab_open_ = merges_open_ = false;
        } else if (in_merges()) {  // a pair ended
            if (pair_ok_ && pair_.size() == 2)
                t_.merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
            else
                bad_merge("a merge is \"a b\" or [\"a\", \"b\"]");
        }
        return true;
    }

    bool value(const int64_t* number, const std::string* s) {
        if (in_vocab()) {
            if (number)
                t_.vocab.emplace_back(stack_.back().key, *number);
            else if (t_.vocab_bad.empty())
                t_.vocab_bad = stack_.back().key;
        } else if (in_merges()) {
            count_++;
            const size_t sp = s ? s->find(' ', 1) : std::string::npos;
            if (s && sp != std::string::npos)
                t_.merges.emplace_back(s->substr(0, sp), s->substr(sp + 1));
            else if (s)
                bad_merge("\"" + *s + "\" is not two tokens");
            else
                bad_merge("a merge is \"a b\" or [\"a\", \"b\"]");
        } else if (in_pair()) {
            if (s)
                pair_.push_back(*s);
            else
                pair_ok_ = false;
        }
        return true;
    }

    TokenizerJson& t_;
    std::vector<Frame> stack_;
    bool vocab_open_ = false, merges_open_ = false;
    size_t count_ = 0;  // merges seen, for the place of a malformed one
    std::vector<std::string> pair_;
    bool pair_ok_ = false;
    std::string error_;
};

}  // namespace

TokenizerJson parse_tokenizer_json(const std::string& text, const std::string& path) {
    TokenizerJson t;
    TablesSax sax(t);
    if (!Json::sax_parse(text, &sax)) fail("{}: not valid JSON ({})", path, sax.error());
    // the document: model's vocab and merges left out (a key event at depth 2 whose parent member is "model")
    std::string top;
    const Json::parser_callback_t skip = [&top](int depth, Json::parse_event_t event, Json& parsed) {
        if (event != Json::parse_event_t::key) return true;
        if (depth == 1) top = parsed.get<std::string>();
        return !(depth == 2 && top == "model" && (parsed == "vocab" || parsed == "merges"));
    };
    t.doc = Json::parse(text, skip);  // (valid: the SAX pass read it)
    return t;
}

}  // namespace anvil
