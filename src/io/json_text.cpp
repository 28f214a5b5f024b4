#include "io/json_text.h"

#include "core/error.h"
#include "io/fs.h"

namespace anvil {

nlohmann::json read_json_file(const std::string& path, const std::string& advice) {
    try {
        return nlohmann::json::parse(read_file(path));
    } catch (const nlohmann::json::exception& e) {
        fail("{}: not valid JSON ({}){}{}", path, e.what(), advice.empty() ? "" : "; ", advice);
    }
}

}  // namespace anvil
