#include "train/supervisor.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/fs.h"
#include "io/json_text.h"

namespace anvil {

namespace {

// The supervisor's only process-wide state, for its signal handler: the worker running now, and whether a
// stop was asked for (no restart after that).
volatile sig_atomic_t g_worker = 0;
volatile sig_atomic_t g_stopping = 0;

extern "C" void pass_stop_on(int sig) {
    g_stopping = 1;
    if (g_worker > 0) ::kill(pid_t(g_worker), sig);
}

// The worker runs in a process group of its own, so a terminal's Ctrl-C reaches it once, through here, and it
// is sent SIGTERM (a checkpoint, then exit) if the supervisor dies first. Everything the child needs is made
// before fork: between fork and exec it calls only async-signal-safe functions.
pid_t start_worker(const std::vector<std::string>& args) {
    std::vector<std::string> all{"anvil"};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::string mark = "ANVIL_SUPERVISED=1";
    std::vector<char*> envp;
    for (char** e = environ; *e; e++)
        if (std::strncmp(*e, "ANVIL_SUPERVISED=", 17) != 0) envp.push_back(*e);
    envp.push_back(mark.data());
    envp.push_back(nullptr);
    const pid_t parent = ::getpid();
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    ANVIL_CHECK(pid >= 0, "--max-restarts: cannot start the worker process ({})", std::strerror(errno));
    if (pid == 0) {
        ::setpgid(0, 0);
        ::prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (::getppid() != parent) std::_Exit(130);  // the supervisor died before prctl took hold
        ::execve("/proc/self/exe", argv.data(), envp.data());
        std::_Exit(127);
    }
    return pid;
}

std::string describe_exit(int status) {
    if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
    const int sig = WTERMSIG(status);
    std::string what = "was killed by signal " + std::to_string(sig);
    if (const char* name = ::sigabbrev_np(sig)) what += std::string(" (SIG") + name + ")";
    if (sig == SIGKILL) what += ": kill -9, or the kernel's out-of-memory killer";
    return what;
}

// The last step metrics.jsonl records (0: none).
int64_t last_logged_step(const std::string& out) {
    std::ifstream f(out + "/metrics.jsonl");
    int64_t step = 0;
    for (std::string line; std::getline(f, line);) {
        const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
        if (j.is_object() && j.contains("step") && j["step"].is_number_integer() && !j.contains("event"))
            step = j["step"].get<int64_t>();
    }
    return step;
}

void append_metrics(const std::string& out, const nlohmann::json& rec) {
    if (!dir_exists(out)) return;  // the worker died before it made the run directory
    std::ofstream f(out + "/metrics.jsonl", std::ios::app);
    f << json_text(rec) << '\n';
}

// summary.json, written by the worker that finished, with the restarts it took
void note_in_summary(const std::string& out, const nlohmann::json& restarts) {
    const std::string path = out + "/summary.json";
    if (!file_exists(path)) return;
    nlohmann::json s = read_json_file(path);
    s["restarts"] = restarts.size();
    s["restart_log"] = restarts;
    write_file_atomic(path, json_text(s, 2) + "\n");
}

}  // namespace

bool supervised_worker() {
    const char* v = std::getenv("ANVIL_SUPERVISED");
    return v && *v;
}

std::vector<std::string> own_arguments() {
    const std::string all = read_file("/proc/self/cmdline");
    std::vector<std::string> args;
    for (size_t at = 0; at < all.size();) {
        const size_t end = all.find('\0', at);
        args.push_back(all.substr(at, end == std::string::npos ? std::string::npos : end - at));
        if (end == std::string::npos) break;
        at = end + 1;
    }
    if (!args.empty()) args.erase(args.begin());
    return args;
}

int supervise(const Supervision& s) {
    struct sigaction sa {};
    sa.sa_handler = pass_stop_on;
    sigemptyset(&sa.sa_mask);
    for (int sig : {SIGINT, SIGTERM, SIGUSR1}) ::sigaction(sig, &sa, nullptr);
    nlohmann::json restarts = nlohmann::json::array();
    for (int attempt = 0;; attempt++) {
        g_worker = start_worker(attempt == 0 ? s.first : s.again);
        int status = 0;
        while (::waitpid(pid_t(g_worker), &status, 0) < 0 && errno == EINTR) {
        }
        g_worker = 0;
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
            if (!restarts.empty()) note_in_summary(s.out, restarts);
            return 0;
        }
        const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (g_stopping || code == 130 || code == 2) return code;  // stopped on purpose, or a bad command line
        const std::string why = describe_exit(status);
        const int64_t step = last_logged_step(s.out);
        if (attempt == s.max_restarts) {
            std::fprintf(stderr,
                         "anvil: the worker %s after step %lld; --max-restarts %d used up, stopping\n",
                         why.c_str(), (long long)step, s.max_restarts);
            return code;
        }
        const int wait_s = std::min(60, 1 << std::min(attempt, 6));
        std::fprintf(
            stderr,
            "anvil: the worker %s after step %lld; restart %d of %d in %d s, from the newest checkpoint "
            "in %s\n",
            why.c_str(), (long long)step, attempt + 1, s.max_restarts, wait_s, s.out.c_str());
        const nlohmann::json rec = {
            {"event", "restart"}, {"restart", attempt + 1}, {"reason", why}, {"after_step", step}};
        restarts.push_back(rec);
        append_metrics(s.out, rec);
        for (int t = 0; t < wait_s * 10 && !g_stopping; t++) ::usleep(100000);
        if (g_stopping) return 130;
    }
}

}  // namespace anvil
