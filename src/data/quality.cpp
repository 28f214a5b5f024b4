#include "data/quality.h"

#include <algorithm>
#include <array>

#include "core/text.h"

namespace anvil {

namespace {

bool space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool letter(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80;  // any non-ASCII byte: a letter's
}
bool ends_with_ellipsis(std::string_view s) {
    return s.ends_with("...") || s.ends_with("\xE2\x80\xA6");
}

}  // namespace

std::vector<std::string> gopher_failures(std::string_view text, const GopherOptions& o) {
    static constexpr std::array<std::string_view, 8> kStop = {"the", "be",   "to",   "of",
                                                              "and", "that", "have", "with"};
    std::vector<std::string_view> words;
    for (size_t i = 0; i < text.size();) {
        while (i < text.size() && space(text[i])) i++;
        const size_t b = i;
        while (i < text.size() && !space(text[i])) i++;
        if (i > b) words.push_back(text.substr(b, i - b));
    }
    std::vector<std::string> fail;
    const size_t n = words.size();
    if (int64_t(n) < o.min_words) fail.push_back("too_few_words");
    if (int64_t(n) > o.max_words) fail.push_back("too_many_words");
    if (n == 0) return fail;
    size_t chars = 0, symbols = 0, alpha = 0, stop = 0;
    for (std::string_view w : words) {
        chars += w.size();
        symbols += w == "#" || w.starts_with('#') || ends_with_ellipsis(w);
        alpha +=
            std::any_of(w.begin(), w.end(), [](char c) { return letter(static_cast<unsigned char>(c)); });
        const std::string l = ascii_lower(w);
        stop += std::find(kStop.begin(), kStop.end(), l) != kStop.end();
    }
    const double mean = double(chars) / double(n);
    if (mean < o.min_mean_word) fail.push_back("short_words");
    if (mean > o.max_mean_word) fail.push_back("long_words");
    if (double(symbols) / double(n) > o.max_symbol_ratio) fail.push_back("symbols");
    size_t lines = 0, bullets = 0, ellipsis = 0;
    for (size_t i = 0; i <= text.size();) {
        size_t e = text.find('\n', i);
        if (e == std::string_view::npos) e = text.size();
        std::string_view line = text.substr(i, e - i);
        while (!line.empty() && space(line.front())) line.remove_prefix(1);
        while (!line.empty() && space(line.back())) line.remove_suffix(1);
        if (!line.empty()) {
            lines++;
            bullets += line.starts_with("\xE2\x80\xA2") || line.starts_with("- ") || line.starts_with("* ");
            ellipsis += ends_with_ellipsis(line);
        }
        i = e + 1;
    }
    if (lines && double(bullets) / double(lines) > o.max_bullet_lines) fail.push_back("bullets");
    if (lines && double(ellipsis) / double(lines) > o.max_ellipsis_lines) fail.push_back("ellipsis");
    if (double(alpha) / double(n) < o.min_alpha_words) fail.push_back("non_alpha");
    if (int64_t(stop) < o.min_stop_words) fail.push_back("no_stop_words");
    return fail;
}

}  // namespace anvil
