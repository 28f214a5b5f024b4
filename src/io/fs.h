// Files that never lose what a user wrote: every write goes to a temporary file in the same directory,
// is flushed to disk, then renamed over the target.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace anvil {

void write_file_atomic(const std::string& path, std::string_view bytes);

// The same for a file written in pieces: bytes go to PATH.tmp.PID; commit() flushes it to disk and renames it
// over PATH. Destroyed without commit() (an error on the way), the temporary is removed.
class AtomicFile {
public:
    explicit AtomicFile(std::string path);
    ~AtomicFile();
    AtomicFile(const AtomicFile&) = delete;
    AtomicFile& operator=(const AtomicFile&) = delete;
    void write(const void* data, size_t n);
    void commit();

private:
    std::string path_, tmp_;
    int fd_ = -1;
};
// Reads a whole file; errors name the path and say what is wrong.
std::string read_file(const std::string& path);
// Reads a file a line at a time: f(line, lineno), lines numbered from 1 without their "\n" or "\r\n"; the
// same errors as read_file.
void read_lines(const std::string& path, const std::function<void(const std::string&, size_t)>& f);
bool file_exists(const std::string& path);
bool dir_exists(const std::string& path);
void make_dirs(const std::string& path);
// Replaces directory `dst` with the fully written directory `tmp` (rename, then drop the old one).
void replace_dir(const std::string& tmp, const std::string& dst);
// A fresh temporary directory name next to `dst`.
std::string temp_dir_for(const std::string& dst);

// A whole regular file mapped read-only, unmapped when destroyed (also when a reader's constructor throws
// after mapping). Errors name the path. An empty file has size 0 and no data.
class MappedFile {
public:
    explicit MappedFile(const std::string& path);
    ~MappedFile();
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;
    const uint8_t* data() const { return static_cast<const uint8_t*>(map_); }
    size_t size() const { return size_; }

private:
    void* map_ = nullptr;
    size_t size_ = 0;
};

}  // namespace anvil
