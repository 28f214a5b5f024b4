#include "io/fs.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace anvil {

namespace fsys = std::filesystem;

AtomicFile::AtomicFile(std::string path)
    : path_(std::move(path)), tmp_(path_ + ".tmp." + std::to_string(::getpid())) {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ANVIL_CHECK(fd_ >= 0, "{}: cannot create ({}); check the directory exists and is writable", tmp_,
                std::strerror(errno));
}

AtomicFile::~AtomicFile() {
    if (fd_ < 0) return;
    ::close(fd_);
    ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t n) {
    ANVIL_ASSERT(fd_ >= 0);
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
        const ssize_t w = ::write(fd_, p, n);
        if (w < 0 && errno == EINTR) continue;
        ANVIL_CHECK(w > 0, "{}: write failed ({}); check free disk space", path_, std::strerror(errno));
        p += w;
        n -= size_t(w);
    }
}

void AtomicFile::commit() {
    ANVIL_ASSERT(fd_ >= 0);
    const bool synced = ::fsync(fd_) == 0;
    ::close(fd_);
    fd_ = -1;
    if (!synced || ::rename(tmp_.c_str(), path_.c_str()) != 0) {
        const int err = errno;
        ::unlink(tmp_.c_str());
        fail("{}: could not be written ({})", path_, std::strerror(err));
    }
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
    AtomicFile f(path);
    f.write(bytes.data(), bytes.size());
    f.commit();
}

namespace {

std::ifstream open_file(const std::string& path) {
    std::error_code ec;
    ANVIL_CHECK(fsys::exists(path, ec), "{}: no such file", path);
    ANVIL_CHECK(!fsys::is_directory(path, ec), "{}: is a directory, expected a file", path);
    std::ifstream f(path, std::ios::binary);
    ANVIL_CHECK(f.good(), "{}: cannot open ({})", path, std::strerror(errno));
    return f;
}

}  // namespace

std::string read_file(const std::string& path) {
    std::ifstream f = open_file(path);
    // one allocation and one read where the size is known (a regular file); a stream through a buffer else
    std::error_code ec;
    const auto size = fsys::is_regular_file(path, ec) ? fsys::file_size(path, ec) : std::uintmax_t(0);
    std::string out;
    if (!ec && size > 0) {
        out.resize(size_t(size));
        f.read(out.data(), std::streamsize(size));
        out.resize(size_t(f.gcount()));
        if (f.gcount() == std::streamsize(size) && f.peek() == std::char_traits<char>::eof()) {
            ANVIL_CHECK(!f.bad(), "{}: read error", path);
            return out;
        }
        f.clear();  // the file changed size while read: take the rest as it comes
    }
    std::ostringstream ss;
    ss << f.rdbuf();
    ANVIL_CHECK(!f.bad(), "{}: read error", path);
    return out + ss.str();
}

void read_lines(const std::string& path, const std::function<void(const std::string&, size_t)>& f) {
    std::ifstream in = open_file(path);
    std::string line;
    for (size_t lineno = 1; std::getline(in, line); lineno++) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        f(line, lineno);
    }
    ANVIL_CHECK(!in.bad(), "{}: read error", path);
}

bool file_exists(const std::string& path) {
    std::error_code ec;
    return fsys::is_regular_file(path, ec);
}

bool dir_exists(const std::string& path) {
    std::error_code ec;
    return fsys::is_directory(path, ec);
}

void make_dirs(const std::string& path) {
    std::error_code ec;
    fsys::create_directories(path, ec);
    ANVIL_CHECK(!ec && dir_exists(path), "{}: cannot create directory ({})", path, ec.message());
}

std::string temp_dir_for(const std::string& dst) {
    std::string d = dst;
    while (d.size() > 1 && d.back() == '/') d.pop_back();
    return d + ".tmp." + std::to_string(::getpid());
}

void replace_dir(const std::string& tmp, const std::string& dst) {
    std::error_code ec;
    std::string d = dst;
    while (d.size() > 1 && d.back() == '/') d.pop_back();
    const std::string old = d + ".old." + std::to_string(::getpid());
    const bool had = fsys::exists(d, ec);
    if (had) {
        fsys::rename(d, old, ec);
        ANVIL_CHECK(!ec, "{}: cannot move the previous version aside ({})", d, ec.message());
    }
    fsys::rename(tmp, d, ec);
    if (ec) {
        if (had) fsys::rename(old, d, ec);
        fail("{}: cannot move the new version into place ({})", d, ec.message());
    }
    if (had) fsys::remove_all(old, ec);
}

MappedFile::MappedFile(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    ANVIL_CHECK(fd >= 0, "{}: cannot open ({})", path, std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        fail("{}: not a regular file", path);
    }
    size_ = size_t(st.st_size);
    if (size_ > 0) map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (map_ == MAP_FAILED) {
        map_ = nullptr;
        fail("{}: cannot map ({})", path, std::strerror(errno));
    }
}

MappedFile::~MappedFile() {
    if (map_) ::munmap(map_, size_);
}

}  // namespace anvil
