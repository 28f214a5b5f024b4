// Opening a directory written by `anvil data prepare` for training and evaluation.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/dataset.h"
#include "data/llmc.h"
#include "data/shard.h"
#include "io/checksum.h"
#include "io/fs.h"
#include "io/json_text.h"

namespace anvil {

bool is_prepared_dir(const std::string& path) {
    return dir_exists(path) && file_exists(path + "/meta.json");
}

nlohmann::json read_prepared_meta(const std::string& dir) {
    const nlohmann::json meta = read_json_file(dir + "/meta.json", "re-run anvil data prepare");
    ANVIL_CHECK(meta.value("format", std::string()) == "anvil-shards" && meta.value("version", 0) == 1,
                "{}/meta.json: not an anvil data directory (format anvil-shards, version 1)", dir);
    return meta;
}

std::unique_ptr<Tokenizer> tokenizer_for_prepared(const std::string& dir) {
    const nlohmann::json meta = read_prepared_meta(dir);
    return tokenizer_for_checkpoint(dir,
                                    {{"anvil_tokenizer", meta["tokenizer"].value("kind", std::string())}});
}

Dataset open_prepared(const std::string& dir, const Tokenizer& tok) {
    const nlohmann::json meta = read_prepared_meta(dir);
    if (meta.contains("files"))  // (written before shards had a manifest: unchecked)
        if (const std::string bad = check_manifest(dir, meta["files"]); !bad.empty())
            fail("{}: the prepared data is damaged ({}); run anvil data prepare again", dir, bad);
    const auto& t = meta["tokenizer"];
    ANVIL_CHECK(
        t.value("vocab_size", -1) == tok.vocab_size() && t.value("eot", -2) == tok.eot_id(),
        "{}: prepared with a tokenizer of {} ids (end-of-text {}), but the run's has {} ({}); train with the "
        "tokenizer saved in that directory",
        dir, t.value("vocab_size", -1), t.value("eot", -2), tok.vocab_size(), tok.eot_id());
    struct Storage {
        std::vector<std::unique_ptr<Shard>> shards;
    };
    auto st = std::make_shared<Storage>();
    auto view_of = [&](const char* split) {
        std::vector<TokenSegment> segs;
        for (const auto& f : meta["splits"][split]["files"]) {
            st->shards.push_back(std::make_unique<Shard>(dir + "/" + f.get<std::string>()));
            ANVIL_CHECK(st->shards.back()->vocab_size() == tok.vocab_size(),
                        "{}: shard vocabulary {} differs from "
                        "meta.json's {}",
                        st->shards.back()->path(), st->shards.back()->vocab_size(), tok.vocab_size());
            segs.push_back(st->shards.back()->segment(tok.eot_id()));
        }
        return TokenView(std::move(segs));
    };
    Dataset d;
    d.path = dir;
    d.train = view_of("train");
    d.val = view_of("val");
    ANVIL_CHECK(!d.train.empty(), "{}: the training split is empty", dir);
    d.records = meta["splits"]["train"].value("records", size_t(0)) +
                meta["splits"]["val"].value("records", size_t(0));
    d.val_records = meta["splits"]["val"].value("records", size_t(0));
    d.jsonl = true;
    d.fingerprint = std::stoull(meta.value("fingerprint", std::string("0")), nullptr, 16);
    if (file_exists(dir + "/val_examples.jsonl")) {
        const std::string ex = read_file(dir + "/val_examples.jsonl");
        if (!ex.empty()) d.val_examples = read_examples_jsonl(dir + "/val_examples.jsonl");
    }
    d.storage = st;
    return d;
}

bool is_data_dir(const std::string& path) {
    return is_prepared_dir(path) || is_llmc_dir(path);
}

Dataset open_data_dir(const std::string& dir, const Tokenizer& tok) {
    return is_llmc_dir(dir) ? open_llmc(dir, tok) : open_prepared(dir, tok);
}

}  // namespace anvil
