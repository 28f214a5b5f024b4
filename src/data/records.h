// Streaming record readers for `anvil data prepare`: every record is validated and either delivered or
// rejected with its file, line and reason; nothing is dropped silently. Memory stays bounded: JSONL and CSV
// are read a line at a time, text files in chunks.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "data/dataset.h"

namespace anvil {

enum class InputFormat { Auto, Text, Jsonl, Csv };
InputFormat parse_format(const std::string& name);   // auto, text, jsonl, csv
InputFormat detect_format(const std::string& path);  // by extension: .jsonl/.json, .csv, else text

struct RecordOptions {
    InputFormat format = InputFormat::Auto;
    std::string text_field = "text";  // JSONL
    std::string csv_column = "text";  // CSV (or the instruction/input/output columns)
    // Text files: fractions of the file where a chunk should end (the split points); the cut is made at the
    // first tokenization-safe position at or after floor(fraction * size).
    std::vector<double> text_cuts;
};

struct RawRecord {
    std::string file;
    size_t line = 0;       // where the record starts (1-based)
    bool example = false;  // an instruction or chat record, in `ex`
    Example ex;
    std::string text;  // text records, or a chunk of a text file
    // Text files arrive in chunks: `chunk_end` is the chunk's end as a fraction of the file (0..1];
    // the last chunk has last_chunk set. JSONL/CSV records are whole (chunk_end = -1).
    double chunk_end = -1.0;
    bool last_chunk = false;
    uint64_t chunk_begin = 0;  // byte offset of a text chunk in its file
    uint64_t bytes = 0;        // the record's size in its file (a JSONL line, a CSV row, a text chunk)
    // A record is a JSONL line, a CSV row or a chunk of a text file (about 1 MiB, cut where tokenization is
    // unaffected). Rejected records: a short kind (bad_json, not_object, missing_field, not_string,
    // empty_text, invalid_utf8, bad_csv, bad_chat) and a message.
    std::string reject_kind, reject;
};

// Reads `path`, calling `f` once per record (or text chunk), valid or rejected. `progress` (may be empty)
// receives the bytes read so far.
// A record's text as the near-duplicate and quality tools compare it (data prepare --near-dedup, data
// dedup, data filter): a text record's text, an instruction record's instruction, input and output, a chat's
// contents, each followed by a newline but the last of an instruction record.
std::string record_text(const RawRecord& r);

// A file's records as text, for the record-level tools (data dedup, data filter): a JSONL line's text is
// record_text() where it is a text, instruction or chat record, else its string fields joined by newlines;
// any other file's lines are its records. Blank lines are not records; the lines are kept as written. A
// malformed JSONL line, or no record, is an error naming the file (and line).
struct TextRecords {
    std::vector<std::string> lines, texts;
    std::vector<size_t> lineno;
};
TextRecords read_text_records(const std::string& path);

void for_each_record(const std::string& path, const RecordOptions& opts,
                     const std::function<void(RawRecord&)>& f,
                     const std::function<void(uint64_t)>& progress = {});

// One JSONL line -> record: {"messages": [...]} (a chat), {"instruction", "input", "output"}, or the text
// field (the parser `data prepare`, the in-memory loader and the fuzz target share).
RawRecord parse_jsonl_line(const std::string& line, const std::string& file, size_t lineno,
                           const std::string& text_field);

}  // namespace anvil
