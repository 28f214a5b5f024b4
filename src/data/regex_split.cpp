#define PCRE2_CODE_UNIT_WIDTH 8
#include "data/regex_split.h"

#include <pcre2.h>

#include "core/error.h"

namespace anvil {

struct RegexSplit::Impl {
    pcre2_code* code = nullptr;
    bool jit = false;
    ~Impl() {
        if (code) pcre2_code_free(code);
    }
};

RegexSplit::RegexSplit(const std::string& pattern, const std::string& what)
    : pattern_(pattern), impl_(std::make_unique<Impl>()) {
    int err = 0;
    PCRE2_SIZE off = 0;
    impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &off, nullptr);
    if (!impl_->code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        fail("{} does not compile at offset {}: {}", what, off, reinterpret_cast<char*>(msg));
    }
    impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

RegexSplit::~RegexSplit() = default;

void RegexSplit::split(std::string_view text, std::vector<uint32_t>& ends) const {
    thread_local pcre2_match_data* md = nullptr;
    if (!md) md = pcre2_match_data_create(4, nullptr);
    const auto* s = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t pos = 0, last = 0;
    while (pos < text.size()) {
        const int rc =
            impl_->jit ? pcre2_jit_match(impl_->code, s, text.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr)
                       : pcre2_match(impl_->code, s, text.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
        if (rc < 0) break;  // no further match
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        const size_t b = ov[0], e = ov[1];
        if (b > last) ends.push_back(uint32_t(b));  // the text between matches
        if (e > b) {
            ends.push_back(uint32_t(e));
            pos = last = e;
        } else {  // an empty match: step one character on
            pos = b + 1;
            while (pos < text.size() && (uint8_t(text[pos]) & 0xC0) == 0x80) pos++;
        }
    }
    if (last < text.size()) ends.push_back(uint32_t(text.size()));
}

bool RegexSplit::search(std::string_view text) const {
    thread_local pcre2_match_data* md = nullptr;
    if (!md) md = pcre2_match_data_create(4, nullptr);
    // UTF checked here (the text is any program's output): invalid UTF-8 is an error code, so no match
    const int rc =
        pcre2_match(impl_->code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0, 0, md, nullptr);
    return rc >= 0;
}

}  // namespace anvil
