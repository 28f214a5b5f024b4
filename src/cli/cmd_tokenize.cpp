// anvil tokenize: text -> ids; anvil tokenizer train: a byte-level BPE from a corpus.
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "core/error.h"
#include "data/bpe.h"
#include "data/dataset.h"
#include "io/fs.h"
#include "io/json_text.h"

namespace anvil::cli {

Command add_tokenize(CLI::App& app) {
    CLI::App* sub = app.add_subcommand("tokenize", "print the token ids of a file, separated by spaces");
    struct Opts {
        std::string tokenizer, special = "on", prompt_template;
        std::vector<std::string> in;
        bool decode = false, records = false;
    };
    auto o = std::make_shared<Opts>();
    sub->add_option("--tokenizer", o->tokenizer,
                    "byte, GPT-2 BPE files, or a Hugging Face tokenizer.json (file or directory)")
        ->required();
    sub->add_option("--in", o->in,
                    "input files, one line of ids each (any bytes; invalid UTF-8 reads as U+FFFD)")
        ->required();
    sub->add_flag("--decode", o->decode, "the other way: each input file holds ids, the text is written out");
    sub->add_flag("--records", o->records,
                  "each input is JSONL of instruction or chat records: print one JSON object per record with the "
                  "template, the record's ids, its loss mask (1 = target) and the generation prompt's ids");
    add_template_flag(sub, o->prompt_template, "with --records; default auto");
    sub->add_option("--special", o->special, "on: special-token text (<|endoftext|>, <|eot_id|>, </s>) is the token")
        ->capture_default_str()
        ->check(CLI::IsMember({"on", "off"}));
    auto run = [o]() -> int {
        const auto tok = make_tokenizer(o->tokenizer);
        if (o->records) {
            const PromptTemplate t = choose_template(o->prompt_template, *tok);
            for (const std::string& path : o->in)
                for (const Example& e : read_examples_jsonl(path)) {
                    const TokenStream r = record_tokens(e, t, *tok);
                    std::vector<int> mask(r.size());
                    for (size_t i = 0; i < r.size(); i++) mask[i] = (r.flags[i] & kInLoss) ? 1 : 0;
                    const nlohmann::ordered_json j = {{"template", template_name(t)},
                                                      {"ids", r.ids},
                                                      {"targets", mask},
                                                      {"prompt", prompt_tokens(e, t, *tok)}};
                    std::printf("%s\n", json_text(j).c_str());
                }
            return 0;
        }
        for (const std::string& path : o->in) {
            const std::string text = read_file(path);
            if (o->decode) {
                std::vector<int32_t> ids;
                size_t pos = 0;
                while (pos < text.size()) {
                    char* end = nullptr;
                    const long v = std::strtol(text.c_str() + pos, &end, 10);
                    if (end == text.c_str() + pos) break;
                    ANVIL_CHECK(v >= 0 && v < tok->vocab_size(), "{}: id {} is outside the vocabulary (0..{})", path,
                                v, tok->vocab_size() - 1);
                    ids.push_back(int32_t(v));
                    pos = size_t(end - text.c_str());
                }
                const std::string out = tok->decode(ids);
                std::fwrite(out.data(), 1, out.size(), stdout);
                continue;
            }
            const std::vector<int32_t> ids = o->special == "on" ? tok->encode_with_specials(text) : tok->encode(text);
            std::string out;
            out.reserve(ids.size() * 6);
            for (size_t i = 0; i < ids.size(); i++) {
                if (i) out.push_back(' ');
                out += std::to_string(ids[i]);
            }
            out.push_back('\n');
            std::fwrite(out.data(), 1, out.size(), stdout);
        }
        return 0;
    };
    return {sub, run};
}

Command add_tokenizer(CLI::App& app) {
    CLI::App* sub = app.add_subcommand("tokenizer", "tokenizer tools");
    CLI::App* train =
        sub->add_subcommand("train", "train a byte-level BPE on text files (GPT-2 pre-tokenizer)");
    sub->require_subcommand(1);
    struct Opts {
        std::vector<std::string> in;
        std::string out;
        int vocab_size = 0;
    };
    auto o = std::make_shared<Opts>();
    train->add_option("--in", o->in, "training text files")->required();
    train
        ->add_option("--vocab-size", o->vocab_size,
                     "ids in the vocabulary (256 bytes + merges + <|endoftext|>)")
        ->required()
        ->check(kPositive);
    train->add_option("--out", o->out, "output directory (tokenizer.json, vocab.json, merges.txt)")
        ->required();
    auto run = [o]() -> int {
        std::vector<std::string> texts;
        for (const auto& f : o->in) {
            texts.push_back(read_file(f));
            ANVIL_CHECK(!texts.back().empty(), "{}: file is empty", f);
        }
        const BpeTokenizer t = train_bpe(texts, o->vocab_size, true);
        make_dirs(o->out);
        t.save(o->out);
        std::printf("wrote %s/tokenizer.json (%d ids, %zu merges)\n", o->out.c_str(), t.vocab_size(),
                    t.num_merges());
        return 0;
    };
    return {sub, run};
}

}  // namespace anvil::cli
