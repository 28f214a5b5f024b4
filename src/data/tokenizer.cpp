#include "data/tokenizer.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/bpe.h"

namespace anvil {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); i++) ids[i] = int32_t(uint8_t(text[i]));
    return ids;
}

std::string ByteTokenizer::decode(const int32_t* ids, size_t n) const {
    std::string s;
    s.reserve(n);
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= 0 && ids[i] < 256)
            s.push_back(char(ids[i]));
        else if (ids[i] == 256)
            s += kEndOfText;
    }
    return s;
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec) {
    if (spec == "byte") return std::make_unique<ByteTokenizer>();
    namespace fs = std::filesystem;
    std::error_code ec;
    if ((fs::is_regular_file(spec, ec) && spec.ends_with(".json")) ||
        fs::is_regular_file(spec + "/tokenizer.json", ec))
        return load_tokenizer_json(spec);
    return std::make_unique<BpeTokenizer>(BpeTokenizer::load(spec));
}

namespace {
bool has_vocabulary_files(const std::string& dir) {
    namespace fs = std::filesystem;
    std::error_code ec;
    return fs::exists(dir + "/tokenizer.json", ec) || fs::exists(dir + "/vocab.json", ec) ||
           fs::exists(dir + "/encoder.json", ec);
}
}  // namespace

bool checkpoint_names_tokenizer(const std::string& dir, const nlohmann::json& config) {
    const std::string kind = config.value("anvil_tokenizer", std::string());
    return kind == "byte" || kind == "bpe" || (kind.empty() && has_vocabulary_files(dir));
}

std::unique_ptr<Tokenizer> tokenizer_for_checkpoint(const std::string& dir, const nlohmann::json& config) {
    ANVIL_CHECK(
        checkpoint_names_tokenizer(dir, config),
        "{}: the checkpoint does not say which tokenizer it was trained with (no \"anvil_tokenizer\" in "
        "config.json and no tokenizer files); pass --tokenizer",
        dir);
    if (config.value("anvil_tokenizer", std::string()) == "byte") return std::make_unique<ByteTokenizer>();
    return make_tokenizer(dir);
}

std::vector<std::string> tokenizer_files_in(const std::string& dir) {
    std::vector<std::string> out;
    namespace fs = std::filesystem;
    std::error_code ec;
    for (const char* f :
         {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
          "tokenizer.model", "vocab.json", "merges.txt", "encoder.json", "vocab.bpe"})
        if (fs::is_regular_file(dir + "/" + f, ec)) out.push_back(f);
    return out;
}

}  // namespace anvil
