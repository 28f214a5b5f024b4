#include "dist/comm.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include "core/error.h"

namespace anvil {

namespace {
// What each launcher sets: the job's size and this process's rank. Open MPI, MPICH/Intel MPI (PMI), PMIx
// launchers, MVAPICH, and Slurm's srun (a job step's task count).
constexpr std::pair<const char*, const char*> kLaunchers[] = {
    {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"},
    {"PMI_SIZE", "PMI_RANK"},
    {"PMIX_SIZE", "PMIX_RANK"},
    {"MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_RANK"},
    {"SLURM_STEP_NUM_TASKS", "SLURM_PROCID"}};
}  // namespace

int launched_world_size(std::string* source) {
    for (const auto& [var, _] : kLaunchers) {
        const char* v = std::getenv(var);
        if (!v || !*v) continue;
        const int n = std::atoi(v);
        if (n < 1) continue;
        if (source) *source = std::string(var) + "=" + v;
        return n;
    }
    return 1;
}

int launched_rank() {
    for (const auto& [_, var] : kLaunchers)
        if (const char* v = std::getenv(var); v && *v) return std::atoi(v);
    return 0;
}

void Comm::quiet_unless_rank0() {
    if (rank_ == 0 || saved_stderr_ >= 0) return;
    std::fflush(stdout);
    std::fflush(stderr);
    saved_stderr_ = ::dup(2);
    const int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (null < 0) return;
    ::dup2(null, 1);
    ::dup2(null, 2);
    ::close(null);
}

namespace {

// One process: every collective is the identity.
class SingleComm final : public Comm {
public:
    explicit SingleComm(double timeout_s) { timeout_s_ = timeout_s; }
    const char* kind() const override { return "single"; }
    Pending allreduce_sum_start(float*, size_t, const char*) override { return {}; }
    void wait(Pending) override {}
    using Comm::allreduce_sum;
    void allreduce_sum(double*, size_t, const char*) override {}
    Pending reduce_sum_start(float*, size_t, int, const char*) override { return {}; }
    void allgather_blocks(float*, const std::vector<size_t>&, const char*) override {}
    void allgather(const void* mine, size_t bytes, void* all, const char*) override {
        if (bytes) std::memcpy(all, mine, bytes);
    }
    void broadcast(void*, size_t, int, const char*) override {}
    void barrier(const char*) override {}
    std::unique_ptr<Comm> split(int, int) override { return std::make_unique<SingleComm>(timeout_s_); }
    [[noreturn]] void abort(const std::string& why) override {
        std::fprintf(stderr, "anvil: error: %s\n", why.c_str());
        std::exit(1);
    }
};

std::string plugin_path() {
    if (const char* p = std::getenv("ANVIL_MPI_PLUGIN"); p && *p) return p;
    std::error_code ec;
    const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    return (ec ? std::filesystem::path(".") : exe.parent_path()) / "libanvil_mpi.so";
}

}  // namespace

std::unique_ptr<Comm> make_comm(double timeout_s) {
    ANVIL_CHECK(timeout_s > 0, "--comm-timeout {}: must be positive (seconds)", timeout_s);
    std::string source;
    const int n = launched_world_size(&source);
    if (n <= 1) return std::make_unique<SingleComm>(timeout_s);
    const std::string path = plugin_path();
    // RTLD_GLOBAL: Open MPI loads its own components with dlopen and needs libmpi's symbols visible to them.
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    ANVIL_CHECK(
        lib,
        "started as one of {} processes ({}), but the MPI plugin {} cannot be loaded ({}); build anvil with "
        "Open MPI's headers present (apt-get install libopenmpi-dev, then rebuild) and launch with Open "
        "MPI's "
        "mpirun or srun",
        n, source, path, dlerror());
    using Create = Comm* (*)(double);
    auto create = reinterpret_cast<Create>(dlsym(lib, "anvil_mpi_comm_create"));
    ANVIL_CHECK(create, "{}: not an anvil MPI plugin (no anvil_mpi_comm_create)", path);
    std::unique_ptr<Comm> c(create(timeout_s));
    ANVIL_CHECK(c && c->size() == n, "{}: MPI reports {} processes where the launcher said {} ({})", path,
                c ? c->size() : 0, n, source);
    return c;  // the library stays loaded for the life of the process (MPI_Finalize runs in the Comm's
               // destructor)
}

void check_same(Comm& c, uint64_t value, const std::string& what) {
    std::vector<uint64_t> all(size_t(c.size()));
    c.allgather(&value, sizeof value, all.data(), ("the start-up check of " + what).c_str());
    for (int r = 1; r < c.size(); r++)
        ANVIL_CHECK(all[size_t(r)] == all[0],
                    "rank {} differs from rank 0 in {} ({:016x} against {:016x}): every rank must be started "
                    "with the "
                    "same flags and see the same data",
                    r, what, all[size_t(r)], all[0]);
}

std::vector<std::string> allgather_text(Comm& c, const std::string& mine, const char* what) {
    uint64_t n = mine.size();
    std::vector<uint64_t> sizes(static_cast<size_t>(c.size()));
    c.allgather(&n, sizeof n, sizes.data(), what);
    const size_t width = *std::max_element(sizes.begin(), sizes.end());
    std::string padded = mine, all(width * sizes.size(), '\0');
    padded.resize(width);
    c.allgather(padded.data(), width, all.data(), what);
    std::vector<std::string> out;
    for (size_t r = 0; r < sizes.size(); r++) out.push_back(all.substr(r * width, size_t(sizes[r])));
    return out;
}

}  // namespace anvil
