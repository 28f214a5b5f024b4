// JSON text that never throws on strings holding invalid UTF-8 (model output, file names, rejected input
// bytes): such bytes are written as U+FFFD.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace anvil {

template <typename Json>
std::string json_text(const Json& j, int indent = -1) {
    return j.dump(indent, ' ', false, Json::error_handler_t::replace);
}

// Parses a JSON file. Invalid JSON is an error naming the file and the parser's complaint, followed by
// `advice` (what to do) when given.
nlohmann::json read_json_file(const std::string& path, const std::string& advice = "");

}  // namespace anvil
