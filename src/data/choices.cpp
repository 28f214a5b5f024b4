#include "data/choices.h"

#include <cctype>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/fs.h"

namespace anvil {

namespace {

const nlohmann::json* first_key(const nlohmann::json& j, std::initializer_list<const char*> keys,
                                std::string& found) {
    for (const char* k : keys)
        if (auto it = j.find(k); it != j.end()) {
            found = k;
            return &*it;
        }
    return nullptr;
}

int parse_label(const nlohmann::json& v, const std::string& where, const std::string& key) {
    if (v.is_number_integer()) return v.get<int>();
    if (v.is_string()) {
        const std::string s = v.get<std::string>();
        ANVIL_CHECK(!s.empty(),
                    "{}: \"{}\" is empty: this item has no answer (HellaSwag's test split is unlabelled; "
                    "evaluate on its validation split)",
                    where, key);
        ANVIL_CHECK(s.size() < 9 && s.find_first_not_of("0123456789") == std::string::npos,
                    "{}: \"{}\" is \"{}\": give the index of the right ending (0, 1, ...)", where, key, s);
        return std::stoi(s);
    }
    fail("{}: \"{}\" must be the index of the right ending (an integer or a string of digits)", where, key);
}

ChoiceItem parse_item(const std::string& line, const std::string& where) {
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
        fail("{}: not valid JSON ({})", where, e.what());
    }
    ANVIL_CHECK(j.is_object(), "{}: a multiple-choice item must be a JSON object", where);
    ChoiceItem item;
    std::string key;
    const nlohmann::json* ctx = first_key(j, {"ctx", "context"}, key);
    ANVIL_CHECK(ctx, "{}: no \"ctx\" (or \"context\"): the text the endings continue", where);
    ANVIL_CHECK(ctx->is_string(), "{}: \"{}\" must be a string", where, key);
    item.context = ctx->get<std::string>();
    const nlohmann::json* ends = first_key(j, {"endings", "choices"}, key);
    ANVIL_CHECK(ends, "{}: no \"endings\" (or \"choices\"): the list of candidate endings", where);
    ANVIL_CHECK(ends->is_array() && ends->size() >= 2, "{}: \"{}\" must be a list of two or more strings",
                where, key);
    for (size_t i = 0; i < ends->size(); i++) {
        const nlohmann::json& e = (*ends)[i];
        ANVIL_CHECK(e.is_string(), "{}: \"{}\"[{}] must be a string", where, key, i);
        ANVIL_CHECK(!e.get<std::string>().empty(), "{}: \"{}\"[{}] is empty: there is nothing to score",
                    where, key, i);
        item.endings.push_back(e.get<std::string>());
    }
    const nlohmann::json* label = first_key(j, {"label", "answer"}, key);
    ANVIL_CHECK(label, "{}: no \"label\" (or \"answer\"): the index of the right ending", where);
    item.label = parse_label(*label, where, key);
    ANVIL_CHECK(item.label >= 0 && size_t(item.label) < item.endings.size(),
                "{}: \"{}\" is {}, but there are {} endings (0 to {})", where, key, item.label,
                item.endings.size(), item.endings.size() - 1);
    return item;
}

bool is_space(char c) {
    return std::isspace(static_cast<unsigned char>(c)) != 0;
}

}  // namespace

std::vector<ChoiceItem> read_choice_items(const std::string& path) {
    std::vector<ChoiceItem> items;
    read_lines(path, [&](const std::string& line, size_t lineno) {
        if (line.find_first_not_of(" \t") != std::string::npos)
            items.push_back(parse_item(line, path + ":" + std::to_string(lineno)));
    });
    ANVIL_CHECK(!items.empty(),
                "{}: no multiple-choice items (one JSON object per line: ctx, endings, label)", path);
    return items;
}

ChoiceRow choice_row(const ChoiceItem& item, size_t ending, const Tokenizer& tok) {
    const std::string& end = item.endings[ending];
    const bool joined = item.context.empty() || is_space(item.context.back()) || is_space(end.front());
    ChoiceRow r;
    r.tokens = tok.encode_prompt(item.context);
    if (r.tokens.empty()) r.tokens.push_back(tok.eot_id());
    r.n_context = int(r.tokens.size());
    const std::vector<int32_t> e = tok.encode_continuation(joined ? end : " " + end, item.context.empty());
    r.tokens.insert(r.tokens.end(), e.begin(), e.end());
    return r;
}

}  // namespace anvil
