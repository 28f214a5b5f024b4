// Files that never lose what a user wrote: every write goes to a temporary file in the same directory,
// is flushed to disk, then renamed over the target.
#pragma once

#include <string>
#include <string_view>

namespace anvil {

void write_file_atomic(const std::string& path, std::string_view bytes);
// Reads a whole file; errors name the path and say what is wrong.
std::string read_file(const std::string& path);
bool file_exists(const std::string& path);
bool dir_exists(const std::string& path);
void make_dirs(const std::string& path);
// Replaces directory `dst` with the fully written directory `tmp` (rename, then drop the old one).
void replace_dir(const std::string& tmp, const std::string& dst);
// A fresh temporary directory name next to `dst`.
std::string temp_dir_for(const std::string& dst);

}  // namespace anvil
