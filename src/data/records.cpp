#include "data/records.h"

#include <csv.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/utf8.h"
#include "io/fs.h"

namespace anvil {

InputFormat parse_format(const std::string& name) {
    if (name == "auto") return InputFormat::Auto;
    if (name == "text") return InputFormat::Text;
    if (name == "jsonl") return InputFormat::Jsonl;
    if (name == "csv") return InputFormat::Csv;
    fail("--format {}: use auto, text, jsonl or csv", name);
}

InputFormat detect_format(const std::string& p) {
    if (p.ends_with(".jsonl") || p.ends_with(".json")) return InputFormat::Jsonl;
    if (p.ends_with(".csv")) return InputFormat::Csv;
    return InputFormat::Text;
}

namespace {

void reject(RawRecord& r, const char* kind, std::string why) {
    r.reject_kind = kind;
    r.reject = std::move(why);
}

// Sets the instruction fields or the text from an object's string fields; rejects with a reason otherwise.
// `flag` is the option that names the text field (--text-field, --csv-column).
void fill_from_fields(RawRecord& r, const std::function<const std::string*(const char*)>& field,
                      bool has_instruction, const std::string& text_field, const char* flag) {
    if (has_instruction) {
        const std::string* ins = field("instruction");
        const std::string* out = field("output");
        if (!ins) return reject(r, "missing_field", "instruction record with missing field \"instruction\"");
        if (!out) return reject(r, "missing_field", "instruction record with missing field \"output\"");
        if (out->empty()) return reject(r, "empty_text", "empty \"output\"");
        r.example = true;
        r.ex.instruction = *ins;
        r.ex.output = *out;
        if (const std::string* in = field("input")) r.ex.input = *in;
        for (const std::string* s : {&r.ex.instruction, &r.ex.input, &r.ex.output})
            if (!utf8::valid(*s)) return reject(r, "invalid_utf8", "invalid UTF-8 in an instruction field");
        return;
    }
    const std::string* t = field(text_field.c_str());
    if (!t)
        return reject(
            r, "missing_field",
            fmt::format("record has neither a \"{}\" field nor the instruction schema {{\"instruction\", "
                        "\"input\", \"output\"}} nor chat \"messages\"; pick the text field with {}",
                        text_field, flag));
    if (t->find_first_not_of(" \t\r\n") == std::string::npos) return reject(r, "empty_text", "empty text");
    if (!utf8::valid(*t)) return reject(r, "invalid_utf8", "invalid UTF-8 in the text");
    r.text = *t;
}

void read_jsonl(const std::string& path, const RecordOptions& o, const std::function<void(RawRecord&)>& f,
                const std::function<void(uint64_t)>& progress) {
    uint64_t bytes = 0;
    read_lines(path, [&](const std::string& line, size_t lineno) {
        bytes += line.size() + 1;
        if (line.find_first_not_of(" \t") == std::string::npos) return;  // blank lines are not records
        RawRecord r = parse_jsonl_line(line, path, lineno, o.text_field);
        r.bytes = line.size() + 1;
        f(r);
        if (progress && (lineno & 1023) == 0) progress(bytes);
    });
    if (progress) progress(bytes);
}

// CSV through libcsv: fields and rows arrive by callback while lines are fed in, so a row's starting line is
// known even when quoted fields span lines.
struct CsvState {
    std::string path;
    const RecordOptions* opts;
    const std::function<void(RawRecord&)>* f;
    std::vector<std::string> header, row;
    size_t line = 0, row_line = 0;
    uint64_t line_begin = 0, line_end = 0, row_begin = 0;  // byte offsets in the file
    bool row_started = false;
};

extern "C" void csv_field_cb(void* s, size_t n, void* data) {
    auto* st = static_cast<CsvState*>(data);
    if (!st->row_started) {
        st->row_started = true;
        st->row_line = st->line;
        st->row_begin = st->line_begin;
    }
    st->row.emplace_back(static_cast<const char*>(s), n);
}

extern "C" void csv_row_cb(int, void* data) {
    auto* st = static_cast<CsvState*>(data);
    std::vector<std::string> row = std::move(st->row);
    st->row.clear();
    st->row_started = false;
    if (st->header.empty()) {
        st->header = std::move(row);
        return;
    }
    if (row.size() == 1 && row[0].empty()) return;  // blank line
    RawRecord r;
    r.file = st->path;
    r.line = st->row_line;
    r.bytes = st->line_end - st->row_begin;
    if (row.size() != st->header.size()) {
        reject(r, "bad_csv", fmt::format("{} fields, the header has {}", row.size(), st->header.size()));
    } else {
        auto col = [&](const char* name) -> const std::string* {
            for (size_t i = 0; i < st->header.size(); i++)
                if (st->header[i] == name) return &row[i];
            return nullptr;
        };
        const bool inst = col("instruction") && col("output") && !col(st->opts->csv_column.c_str());
        fill_from_fields(r, col, inst, st->opts->csv_column, "--csv-column");
    }
    (*st->f)(r);
}

void read_csv(const std::string& path, const RecordOptions& o, const std::function<void(RawRecord&)>& f,
              const std::function<void(uint64_t)>& progress) {
    csv_parser p;
    ANVIL_CHECK(csv_init(&p, CSV_APPEND_NULL) == 0, "csv: cannot initialise the parser");
    CsvState st{path, &o, &f, {}, {}, 0, 0, 0, 0, 0, false};
    uint64_t bytes = 0;
    try {
        read_lines(path, [&](const std::string& line, size_t lineno) {
            st.line = lineno;
            const std::string l = line + "\n";
            st.line_begin = bytes;
            bytes += l.size();
            st.line_end = bytes;
            if (csv_parse(&p, l.data(), l.size(), csv_field_cb, csv_row_cb, &st) != l.size())
                fail("{}:{}: CSV parse error ({})", path, lineno, csv_strerror(csv_error(&p)));
            if (progress && (lineno & 1023) == 0) progress(bytes);
        });
        st.line++;
        csv_fini(&p, csv_field_cb, csv_row_cb, &st);
    } catch (...) {
        csv_free(&p);
        throw;
    }
    csv_free(&p);
    ANVIL_CHECK(!st.header.empty(), "{}: empty CSV (no header row)", path);
    if (progress) progress(bytes);
}

// Text files in chunks of about kChunk bytes, cut where GPT-2's pre-tokenizer splits anyway: between an
// ASCII letter and " <letter>", or at a newline between two non-space ASCII characters. The tokens are then
// the same as for the whole file.
constexpr size_t kChunk = 1 << 20;

bool safe_cut(const std::string& s, size_t p) {
    if (p == 0 || p + 1 >= s.size()) return false;
    auto letter = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
    auto solid = [](char c) { return uint8_t(c) > 0x20 && uint8_t(c) < 0x7f; };
    if (letter(s[p - 1]) && s[p] == ' ' && letter(s[p + 1])) return true;
    return s[p] == '\n' && solid(s[p - 1]) && solid(s[p + 1]);
}

void read_text(const std::string& path, const std::vector<double>& cuts,
               const std::function<void(RawRecord&)>& f, const std::function<void(uint64_t)>& progress) {
    std::ifstream in(path, std::ios::binary);
    ANVIL_CHECK(in.good(), "{}: cannot open ({})", path, std::strerror(errno));
    in.seekg(0, std::ios::end);
    const uint64_t total = uint64_t(in.tellg());
    in.seekg(0);
    if (total == 0) {
        RawRecord r;
        r.file = path;
        r.line = 1;
        r.chunk_end = 1.0;
        r.last_chunk = true;
        reject(r, "empty_text", "the file is empty");
        f(r);
        return;
    }
    std::string buf, next(kChunk, '\0');
    uint64_t consumed = 0;
    size_t line = 1;
    bool eof = false;
    while (!eof || !buf.empty()) {
        while (!eof && buf.size() < 2 * kChunk) {
            in.read(next.data(), std::streamsize(next.size()));
            const size_t got = size_t(in.gcount());
            buf.append(next.data(), got);
            if (got < next.size()) eof = true;
        }
        ANVIL_CHECK(!in.bad(), "{}: read error", path);
        size_t want = kChunk;  // the next chunk ends at a split point if one comes first
        for (double c : cuts) {
            const uint64_t b = uint64_t(c * double(total));
            if (b > consumed && b - consumed < want) want = size_t(b - consumed);
        }
        size_t cut = buf.size();
        if (buf.size() > want) {
            cut = 0;
            for (size_t p = want; p < buf.size() && !cut; p++)
                if (safe_cut(buf, p)) cut = p;
            if (!cut && !eof) cut = want;  // nothing safe here (no spaces at all): the boundary may shift
            if (!cut) cut = buf.size();
        }
        RawRecord r;
        r.file = path;
        r.line = line;
        r.text = buf.substr(0, cut);
        r.bytes = cut;
        r.chunk_begin = consumed;
        consumed += cut;
        r.chunk_end = total ? double(consumed) / double(total) : 1.0;
        r.last_chunk = eof && cut == buf.size();
        for (char c : r.text) line += c == '\n';
        buf.erase(0, cut);
        if (consumed == cut && r.text.find_first_not_of(" \t\r\n") == std::string::npos && r.last_chunk)
            reject(r, "empty_text", "the file holds no text");
        else if (const size_t bad = utf8::first_invalid(r.text); bad != std::string::npos)
            reject(
                r, "invalid_utf8",
                fmt::format("invalid UTF-8 at byte {} (line {}); the whole chunk, bytes {} to {} of the file "
                            "({} bytes), is dropped: convert the file to UTF-8 (e.g. iconv -f latin1 -t "
                            "utf-8)",
                            r.chunk_begin + bad,
                            r.line + size_t(std::count(r.text.begin(), r.text.begin() + long(bad), '\n')),
                            r.chunk_begin, consumed, cut));
        f(r);
        if (progress) progress(consumed);
        if (r.last_chunk) break;
    }
}

}  // namespace

namespace {
// {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}
void parse_chat(RawRecord& r, const nlohmann::json& msgs) {
    if (!msgs.is_array())
        return reject(r, "bad_chat", "\"messages\" must be an array of {\"role\", \"content\"}");
    std::vector<Message> m;
    for (size_t i = 0; i < msgs.size(); i++) {
        const nlohmann::json& x = msgs[i];
        if (!x.is_object() || !x.contains("role") || !x.contains("content"))
            return reject(r, "bad_chat",
                          fmt::format("message {}: not an object with \"role\" and \"content\"", i + 1));
        if (!x["role"].is_string() || !x["content"].is_string())
            return reject(r, "bad_chat",
                          fmt::format("message {}: \"role\" and \"content\" must be strings", i + 1));
        Role role;
        const std::string name = x["role"].get<std::string>();
        if (!parse_role(name, &role))
            return reject(
                r, "bad_chat",
                fmt::format("message {}: unknown role \"{}\"; use system, user or assistant", i + 1, name));
        m.push_back({role, x["content"].get<std::string>()});
        if (!utf8::valid(m.back().content)) return reject(r, "invalid_utf8", "invalid UTF-8 in a message");
    }
    if (const std::string why = chat_problem(m); !why.empty()) return reject(r, "bad_chat", why);
    r.example = true;
    r.ex.messages = std::move(m);
}
}  // namespace

RawRecord parse_jsonl_line(const std::string& line, const std::string& file, size_t lineno,
                           const std::string& text_field) {
    RawRecord r;
    r.file = file;
    r.line = lineno;
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
        const std::string what = e.what();
        if (what.find("UTF-8") != std::string::npos || what.find("utf-8") != std::string::npos)
            reject(r, "invalid_utf8", "invalid UTF-8");
        else
            reject(r, "bad_json",
                   "invalid JSON (" + what.substr(what.find(']') + 2) + "); fix or remove the line");
        return r;
    }
    if (!j.is_object()) {
        reject(r, "not_object", "each line must be a JSON object");
        return r;
    }
    if (j.contains("messages")) {
        parse_chat(r, j["messages"]);
        return r;
    }
    std::vector<std::pair<std::string, std::string>> strings;
    for (auto it = j.begin(); it != j.end(); ++it)
        if (it.value().is_string()) strings.emplace_back(it.key(), it.value().get<std::string>());
    auto field = [&](const char* name) -> const std::string* {
        for (const auto& [k, v] : strings)
            if (k == name) return &v;
        return nullptr;
    };
    const bool inst = j.contains("instruction") || j.contains("output");
    for (const char* k : {"instruction", "input", "output"})
        if (inst && j.contains(k) && !j[k].is_string() && !j[k].is_null()) {
            reject(r, "not_string", std::string("field \"") + k + "\" is not a string");
            return r;
        }
    if (!inst && j.contains(text_field) && !j[text_field].is_string()) {
        reject(r, "not_string", "field \"" + text_field + "\" is not a string");
        return r;
    }
    fill_from_fields(r, field, inst, text_field, "--text-field");
    return r;
}

namespace {
void add_strings(const nlohmann::json& j, std::string& text) {
    if (j.is_string()) {
        text += (text.empty() ? "" : "\n") + j.get<std::string>();
    } else if (j.is_array() || j.is_object()) {
        for (const auto& v : j) add_strings(v, text);
    }
}
}  // namespace

std::string record_text(const RawRecord& r) {
    if (!r.example) return r.text;
    if (!r.ex.chat()) return r.ex.instruction + "\n" + r.ex.input + "\n" + r.ex.output;
    std::string s;
    for (const Message& m : r.ex.messages) s += m.content + "\n";
    return s;
}

TextRecords read_text_records(const std::string& path) {
    TextRecords r;
    const bool jsonl = detect_format(path) == InputFormat::Jsonl;
    read_lines(path, [&](const std::string& line, size_t lineno) {
        if (line.find_first_not_of(" \t\r") == std::string::npos) return;
        std::string text = line;
        if (jsonl) {
            nlohmann::json j;
            try {
                j = nlohmann::json::parse(line);
            } catch (const nlohmann::json::parse_error& e) {
                fail("{} line {}: not JSON ({}); fix the line or remove it", path, lineno, e.what());
            }
            text.clear();
            if (const RawRecord raw = parse_jsonl_line(line, path, lineno, "text"); raw.reject.empty())
                text = record_text(raw);  // a text, instruction or chat record: as data prepare reads it
            else
                add_strings(j, text);
        }
        r.lines.push_back(line);
        r.texts.push_back(std::move(text));
        r.lineno.push_back(lineno);
    });
    ANVIL_CHECK(!r.lines.empty(), "{}: no records in it", path);
    return r;
}

void for_each_record(const std::string& path, const RecordOptions& opts,
                     const std::function<void(RawRecord&)>& f,
                     const std::function<void(uint64_t)>& progress) {
    const InputFormat fmt = opts.format == InputFormat::Auto ? detect_format(path) : opts.format;
    switch (fmt) {
        case InputFormat::Jsonl:
            return read_jsonl(path, opts, f, progress);
        case InputFormat::Csv:
            return read_csv(path, opts, f, progress);
        default:
            return read_text(path, opts.text_cuts, f, progress);
    }
}

}  // namespace anvil
