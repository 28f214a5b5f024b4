#include "runtime/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <regex>

#include "core/error.h"
#include "io/fs.h"
#include "io/json_text.h"
#include "runtime/gguf_model.h"

namespace anvil {

namespace fsys = std::filesystem;

namespace {
std::string host_name() {
    char buf[256] = {};
    if (::gethostname(buf, sizeof buf - 1) != 0) return "?";
    return buf;
}
std::string now_text() {
    const std::time_t t = std::time(nullptr);
    char buf[64];
    std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", std::localtime(&t));
    return buf;
}
}  // namespace

RunDirLock::RunDirLock(const std::string& dir, const std::string& flag) : path_(dir + "/anvil.lock") {
    for (int attempt = 0; attempt < 8; attempt++) {
        const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        ANVIL_CHECK(fd >= 0, "{} {}: cannot create {} ({})", flag, dir, path_, std::strerror(errno));
        if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
            const int err = errno;
            std::string owner;
            char buf[512] = {};
            const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
            if (n > 0) owner.assign(buf, size_t(n));
            while (!owner.empty() && (owner.back() == '\n' || owner.back() == ' ')) owner.pop_back();
            ::close(fd);
            ANVIL_CHECK(err != EWOULDBLOCK,
                        "{} {}: another anvil process is writing this run directory ({}); "
                        "wait for it to finish, or choose another {}",
                        flag, dir, owner.empty() ? "its lock file names no owner" : owner, flag);
            fail("{} {}: cannot lock {} ({})", flag, dir, path_, std::strerror(err));
        }
        // The previous owner may have removed the file between our open and our lock: lock the file that
        // is at the path now.
        struct stat held {
        }, at_path{};
        if (::fstat(fd, &held) == 0 && ::stat(path_.c_str(), &at_path) == 0 &&
            held.st_ino == at_path.st_ino && held.st_dev == at_path.st_dev) {
            const std::string who = "pid " + std::to_string(::getpid()) + " on host " + host_name() +
                                    ", started " + now_text() + "\n";
            if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, who.data(), who.size(), 0) != ssize_t(who.size())) {
                const int err = errno;
                ::close(fd);
                fail("{} {}: cannot write {} ({})", flag, dir, path_, std::strerror(err));
            }
            fd_ = fd;
            return;
        }
        ::close(fd);
    }
    fail("{} {}: could not take the lock {} (it keeps changing); is another process starting here?", flag,
         dir, path_);
}

RunDirLock::RunDirLock(RunDirLock&& o) noexcept {
    *this = std::move(o);
}

RunDirLock& RunDirLock::operator=(RunDirLock&& o) noexcept {
    if (this != &o) {
        release();
        fd_ = o.fd_;
        path_ = std::move(o.path_);
        o.fd_ = -1;
    }
    return *this;
}

RunDirLock::~RunDirLock() {
    release();
}

void RunDirLock::release() {
    if (fd_ < 0) return;
    ::unlink(path_.c_str());  // while still locked: a waiting process then locks a fresh file
    ::close(fd_);
    fd_ = -1;
}

std::string clean_stale_temporaries(const std::string& dir) {
    static const std::regex stale(R"((.+)\.(tmp|old)\.[0-9]+)");
    std::vector<std::string> removed, restored;
    uintmax_t bytes = 0;
    std::error_code ec;
    for (const auto& e : fsys::directory_iterator(dir, ec)) {
        const std::string name = e.path().filename().string();
        std::smatch m;
        if (!std::regex_match(name, m, stale)) continue;
        const fsys::path target = e.path().parent_path() / m[1].str();
        if (m[2] == "old" && !fsys::exists(target, ec)) {
            // The save moved the previous version aside and died before the new one took its place.
            fsys::rename(e.path(), target, ec);
            if (!ec) {
                restored.push_back(name + " -> " + m[1].str());
                continue;
            }
        }
        if (e.is_directory(ec)) {
            for (const auto& f : fsys::recursive_directory_iterator(e.path(), ec))
                if (f.is_regular_file(ec)) bytes += f.file_size(ec);
        } else {
            bytes += e.file_size(ec);
        }
        fsys::remove_all(e.path(), ec);
        ANVIL_CHECK(!ec, "{}: cannot remove the stale temporary {} ({})", dir, e.path().string(),
                    ec.message());
        removed.push_back(name);
    }
    std::string msg;
    if (!removed.empty()) {
        std::sort(removed.begin(), removed.end());
        std::string names;
        for (const auto& n : removed) names += (names.empty() ? "" : ", ") + n;
        msg = fmt::format("removed {} stale temporar{} left by an interrupted save ({}; {:.1f} MB)",
                          removed.size(), removed.size() == 1 ? "y" : "ies", names, double(bytes) / 1e6);
    }
    for (const auto& r : restored) msg += (msg.empty() ? "" : "; ") + std::string("restored ") + r;
    return msg;
}

std::string resolve_model_dir(const std::string& path, const char* flag) {
    if (is_gguf_file(path)) return gguf_model_dir(path);  // llama.cpp's file, read into a directory once
    ANVIL_CHECK(dir_exists(path), "{} {}: no such directory", flag, path);
    for (const std::string& d : {path, path + "/final"})
        if (file_exists(d + "/config.json") || file_exists(d + "/adapter_config.json")) return d;
    return resolve_checkpoint(path, flag);
}

bool is_adapter_dir(const std::string& dir) {
    return file_exists(dir + "/adapter_config.json") && !file_exists(dir + "/config.json");
}

namespace {

// The step a checkpoint directory holds: trainer_state.json's, else (missing or unreadable: a damaged
// checkpoint, which its reader names) the N of checkpoint-N; -1 for neither.
int64_t checkpoint_step(const fsys::path& dir) {
    try {
        return read_json_file((dir / "trainer_state.json").string()).value("step", int64_t(-1));
    } catch (const Error&) {
        const std::string name = dir.filename().string();
        if (!name.starts_with("checkpoint-")) return -1;
        try {
            return std::stoll(name.substr(11));
        } catch (const std::exception&) {
            return -1;
        }
    }
}

}  // namespace

std::vector<std::string> list_checkpoints(const std::string& run_dir) {
    std::vector<std::pair<int64_t, std::string>> found;
    if (!dir_exists(run_dir)) return {};
    for (const auto& e : fsys::directory_iterator(run_dir)) {
        if (!e.is_directory()) continue;
        const std::string name = e.path().filename().string();
        if (name != "final" && !name.starts_with("checkpoint-")) continue;
        if (name.find(".tmp.") != std::string::npos || name.find(".old.") != std::string::npos) continue;
        found.emplace_back(checkpoint_step(e.path()), e.path().string());
    }
    std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a > b; });
    std::vector<std::string> dirs;
    for (auto& f : found) dirs.push_back(std::move(f.second));
    return dirs;
}

std::string resolve_checkpoint(const std::string& dir, const char* flag) {
    ANVIL_CHECK(dir_exists(dir), "{} {}: no such directory", flag, dir);
    if (file_exists(dir + "/trainer_state.json")) return dir;
    const std::vector<std::string> all = list_checkpoints(dir);
    ANVIL_CHECK(!all.empty(),
                "{} {}: no training checkpoint here (a directory with trainer_state.json, or a run directory "
                "holding checkpoint-N or final)",
                flag, dir);
    return all.front();
}

}  // namespace anvil
