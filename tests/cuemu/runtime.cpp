// cuemu's runtime (see cuemu.h): the block scheduler with a fiber per thread, the CUDA runtime calls anvil
// makes, and cuBLASLt's matmul (column-major, batched, with the epilogues anvil uses) through OpenBLAS.
#include "cuemu.h"

#include <cblas.h>
#include <cublasLt.h>
#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <string>
#include <vector>

// The fiber switch: saves the callee-saved registers on the current stack, stores its pointer in *save and
// continues on `next` (a stack the same routine saved, or a new one laid out by Stack::start). glibc's
// swapcontext would do, but it makes a system call per switch (the signal mask), which doubled the run time.
// The FP control words (MXCSR, x87) are not switched: every fiber of a launch runs with the defaults, which
// run_kernel sets for the whole launch (FPControl). Saving and loading them here serialised the pipeline at
// every barrier and shuffle and, depending on where the linker put this routine, took 33 to 61% of a run.
#if !defined(__x86_64__)
#error "cuemu's fiber switch is written for x86-64"
#endif
extern "C" void cuemu_switch(void** save, void* next);
asm(R"(
    .text
    .globl cuemu_switch
    .type cuemu_switch, @function
cuemu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size cuemu_switch, .-cuemu_switch
    .section .note.GNU-stack, "", @progbits
    .text
)");

namespace cuemu {
namespace {

[[noreturn]] void die(const std::string& what) {
    std::fprintf(stderr, "cuemu: %s\n", what.c_str());
    std::fflush(stderr);
    std::abort();
}

// ---- the block scheduler ----

enum class St { Run, AtBlock, AtWarp, Done };

// The FP control words at their defaults (MXCSR 0x1F80: round to nearest, no flush-to-zero or
// denormals-are-zero, exceptions masked; x87 0x037F) for a launch's lifetime, and the launching thread's back
// after it (anvil's CPU threads flush denormals, which a kernel must not inherit).
struct FPControl {
    uint32_t mxcsr = 0;
    uint16_t x87 = 0;
    FPControl() {
        asm volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(mxcsr), "=m"(x87));
        const uint32_t m = 0x1F80;
        const uint16_t c = 0x037F;
        asm volatile("ldmxcsr %0\n\tfldcw %1" : : "m"(m), "m"(c));
    }
    ~FPControl() { asm volatile("ldmxcsr %0\n\tfldcw %1" : : "m"(mxcsr), "m"(x87)); }
    FPControl(const FPControl&) = delete;
    FPControl& operator=(const FPControl&) = delete;
};

constexpr size_t kStackBytes = 256 << 10, kGuardBytes = 4096;

struct Stack {
    char* base = nullptr;
    Stack() {
        void* p = mmap(nullptr, kStackBytes + kGuardBytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) die("cannot map a fiber stack");
        base = static_cast<char*>(p);
        mprotect(base, kGuardBytes, PROT_NONE);  // an overflow faults instead of writing a neighbour
    }
    ~Stack() { munmap(base, kStackBytes + kGuardBytes); }
    // A stack pointer that cuemu_switch "returns" from into entry(): the saved registers, then entry's
    // address, then a zero return address for entry (which never returns) at the 16-aligned top.
    void* start(void (*entry)()) const {
        auto* top = reinterpret_cast<uint64_t*>(base + kGuardBytes + kStackBytes);
        uint64_t* sp = top - 8;
        for (int i = 0; i < 6; i++) sp[i] = 0;  // r15 r14 r13 r12 rbx rbp
        sp[6] = reinterpret_cast<uint64_t>(entry);
        sp[7] = 0;
        return sp;
    }
    Stack(const Stack&) = delete;
    Stack& operator=(const Stack&) = delete;
};

// A cp.async copy in flight: its 16 bytes, read at issue, land in shared memory only at the wait that covers
// its group, so a read before that wait (and the barrier after it) sees what the tile held before.
struct AsyncCopy {
    unsigned char* dst;
    unsigned char data[16];
};

struct Fiber {
    void* sp = nullptr;
    uint3 tid;
    St st = St::Run;
    unsigned wmask = 0;                         // the mask of the warp barrier it waits at
    std::vector<AsyncCopy> open;                // cp.async copies not yet committed to a group
    std::deque<std::vector<AsyncCopy>> groups;  // committed groups, oldest first
};

struct Block {
    const void* kernel = nullptr;
    dim3 grid, block;
    uint3 bid;
    const std::function<void()>* body = nullptr;
    std::vector<Fiber> fibers;
    std::vector<uint64_t> slots;          // one shuffle value per thread
    std::vector<unsigned char> xslots;    // kWarpSlot bytes per thread, for warp_gather
    std::vector<unsigned char> smem_buf;  // dynamic shared memory, from a 1024-byte boundary in it
    unsigned char* smem = nullptr;
    size_t smem_bytes = 0;
    void* sched = nullptr;
    int cur = 0;
};

thread_local Block* g_block = nullptr;
thread_local std::vector<std::unique_ptr<Stack>> g_stacks;
thread_local cudaError_t g_last_error = cudaSuccess;
std::mutex g_attr_mutex;
std::map<const void*, int> g_max_dyn_smem;  // cudaFuncAttributeMaxDynamicSharedMemorySize per kernel
// each kernel's static __shared__ arrays, as they register on first use
thread_local std::map<const void*, std::vector<std::pair<void*, size_t>>> g_static_smem;

Fiber& me() {
    return g_block->fibers[size_t(g_block->cur)];
}

void yield(St st) {
    Fiber& f = me();
    f.st = st;
    cuemu_switch(&f.sp, g_block->sched);
}

std::string where(const Block& b) {
    return "block (" + std::to_string(b.bid.x) + "," + std::to_string(b.bid.y) + "," +
           std::to_string(b.bid.z) + ")";
}

[[noreturn]] void fiber_entry() {
    (*g_block->body)();
    Fiber& f = me();
    if (!f.open.empty() || !f.groups.empty())
        die(where(*g_block) + ", thread " + std::to_string(g_block->cur) +
            ": exits with cp.async copies it never waited for (cp.async.wait_group 0 first)");
    f.st = St::Done;
    cuemu_switch(&f.sp, g_block->sched);  // never resumed
    die("a finished fiber was resumed");
}

// Warps: one warp at a time runs on to its next __syncthreads before the next warp starts (a warp that
// overtakes the others, as a GPU may let it), so a tile that one warp overwrites while another still reads it
// shows.
enum class Order { Forward, Reverse, Shuffle, Warps };

Order order_from_env() {
    const char* e = std::getenv("CUEMU_ORDER");
    const std::string s = e ? e : "forward";
    if (s == "forward") return Order::Forward;
    if (s == "reverse") return Order::Reverse;
    if (s == "shuffle") return Order::Shuffle;
    if (s == "warps") return Order::Warps;
    die("CUEMU_ORDER must be forward, reverse, shuffle or warps, not '" + s + "'");
}

// Releases the waiters of barriers every participant has reached; false when none could be released.
bool release(Block& b) {
    const size_t n = b.fibers.size();
    bool released = false;
    for (size_t w0 = 0; w0 < n; w0 += 32) {
        const size_t w1 = std::min(n, w0 + 32);
        unsigned mask = 0;
        for (size_t i = w0; i < w1; i++)
            if (b.fibers[i].st == St::AtWarp) mask |= b.fibers[i].wmask;
        if (mask == 0) continue;
        bool complete = true;
        for (unsigned lane = 0; lane < 32; lane++) {
            if (!(mask >> lane & 1u)) continue;
            if (w0 + lane >= w1 || b.fibers[w0 + lane].st == St::Done)
                die(where(b) + ": a warp barrier or shuffle names lane " + std::to_string(lane) +
                    " of warp " + std::to_string(w0 / 32) +
                    ", which has exited or does not exist (undefined on a GPU)");
            if (b.fibers[w0 + lane].st != St::AtWarp) complete = false;
        }
        if (!complete) continue;
        for (size_t i = w0; i < w1; i++)
            if (b.fibers[i].st == St::AtWarp) b.fibers[i].st = St::Run;
        released = true;
    }
    if (released) return true;
    bool all_at_block = true, any = false;
    for (const Fiber& f : b.fibers) {
        if (f.st == St::Done) continue;
        any = true;
        if (f.st != St::AtBlock) all_at_block = false;
    }
    if (!any || !all_at_block) return false;
    for (Fiber& f : b.fibers)
        if (f.st == St::AtBlock) f.st = St::Run;
    return true;
}

void run_block(Block& b, Order order, std::mt19937& rng) {
    const size_t n = b.fibers.size();
    while (g_stacks.size() < n) g_stacks.push_back(std::make_unique<Stack>());
    for (size_t i = 0; i < n; i++) {
        Fiber& f = b.fibers[i];
        f.tid = uint3{unsigned(i % b.block.x), unsigned(i / b.block.x % b.block.y),
                      unsigned(i / (b.block.x * b.block.y))};
        f.st = St::Run;
        f.open.clear();
        f.groups.clear();
        f.sp = g_stacks[i]->start(fiber_entry);
    }
    std::vector<int> idx(n);
    for (size_t i = 0; i < n; i++) idx[i] = order == Order::Reverse ? int(n - 1 - i) : int(i);
    for (;;) {
        if (order == Order::Shuffle) std::shuffle(idx.begin(), idx.end(), rng);
        int only = -1;  // Warps: the first warp that can run
        for (size_t i = 0; order == Order::Warps && i < n && only < 0; i++)
            if (b.fibers[i].st == St::Run) only = int(i / 32);
        for (int i : idx) {
            if (b.fibers[size_t(i)].st != St::Run || (only >= 0 && i / 32 != only)) continue;
            b.cur = i;
            cuemu_switch(&b.sched, b.fibers[size_t(i)].sp);
        }
        bool done = true, runnable = false;
        for (const Fiber& f : b.fibers) {
            done = done && f.st == St::Done;
            runnable = runnable || f.st == St::Run;
        }
        if (done) return;
        if (!release(b) && !runnable) {
            std::string states;
            for (size_t i = 0; i < n; i++) {
                const St s = b.fibers[i].st;
                states += s == St::Done ? 'D' : s == St::AtBlock ? 'B' : 'W';
            }
            die(where(b) +
                ": deadlock, threads wait at barriers the others never reach (per thread: "
                "D exited, B __syncthreads, W warp barrier): " +
                states);
        }
    }
}

}  // namespace

const uint3& thread_idx() {
    return me().tid;
}
const uint3& block_idx() {
    return g_block->bid;
}
const dim3& block_dim() {
    return g_block->block;
}
const dim3& grid_dim() {
    return g_block->grid;
}
void* dynamic_smem() {
    return g_block->smem;
}
void check_smem_span(const void* first, const void* last) {
    const auto* b = g_block->smem_buf.data();
    const auto* f = static_cast<const unsigned char*>(first);
    if (f < b || f >= b + g_block->smem_buf.size()) return;  // not the dynamic shared memory
    if (f < g_block->smem || static_cast<const unsigned char*>(last) > g_block->smem + g_block->smem_bytes)
        fail("an access past the launch's " + std::to_string(g_block->smem_bytes) +
             " bytes of dynamic shared memory");
}
size_t smem_optin() {
    static const size_t kib = [] {
        const char* e = std::getenv("CUEMU_SMEM_OPTIN_KIB");
        return e && *e ? size_t(std::strtoul(e, nullptr, 10)) : size_t(227);
    }();
    return kib << 10;
}
void fail(const std::string& what) {
    die(where(*g_block) + ", thread " + std::to_string(g_block->cur) + ": " + what);
}
void misaligned(size_t size, size_t align) {
    const std::string what = "a " + std::to_string(size) +
                             "-byte access at an address that is not a multiple of " + std::to_string(align);
    if (g_block) fail(what);
    die("host code: " + what);
}
bool register_shared(void* array, size_t bytes) {
    g_static_smem[g_block->kernel].emplace_back(array, bytes);
    return true;
}
void sync_block() {
    yield(St::AtBlock);
}
void sync_warp(unsigned mask) {
    me().wmask = mask;
    yield(St::AtWarp);
}

uint64_t shuffle(unsigned mask, uint64_t value, Shfl kind, int arg, int width) {
    const int self = g_block->cur, lane = self % 32, warp0 = self - lane;
    if (!(mask >> lane & 1u)) die(where(*g_block) + ": a shuffle's mask leaves out the calling lane");
    g_block->slots[size_t(self)] = value;
    sync_warp(mask);
    const int seg = lane & ~(width - 1);
    const int src = kind == Shfl::Xor ? lane ^ arg : seg + (arg & (width - 1));
    // a source outside the segment (xor past the width) gives the caller its own value, as on a GPU
    const int from = (src < seg || src >= seg + width) ? lane : src;
    const uint64_t out = g_block->slots[size_t(warp0 + from)];
    sync_warp(mask);  // nobody overwrites a slot before every lane has read
    return out;
}

void cp_async16(void* dst, const void* src, int src_bytes) {
    auto* d = static_cast<unsigned char*>(dst);
    if (d < g_block->smem || d + 16 > g_block->smem + g_block->smem_bytes)
        fail("cp.async: the destination is not inside the launch's dynamic shared memory");
    if (reinterpret_cast<uintptr_t>(dst) % 16 != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0)
        fail("cp.async: a 16-byte copy from or to an address that is not a multiple of 16");
    if (src_bytes < 0 || src_bytes > 16) fail("cp.async: the source size must be 0 to 16 bytes");
    AsyncCopy c{d, {}};
    std::memcpy(c.data, src, size_t(src_bytes));  // the rest stays zero, as the hardware fills it
    // CUEMU_CP_ASYNC=early lands it now, the earliest a GPU may: a tile overwritten while another warp still
    // reads it (a missing barrier before the copies) shows then, as a missing wait shows by default
    static const bool early = [] {
        const char* e = std::getenv("CUEMU_CP_ASYNC");
        const std::string v = e ? e : "late";
        if (v != "early" && v != "late") die("CUEMU_CP_ASYNC must be early or late, not '" + v + "'");
        return v == "early";
    }();
    if (early)
        std::memcpy(d, c.data, 16);
    else
        me().open.push_back(c);
}
void cp_async_commit() {
    Fiber& f = me();
    f.groups.push_back(std::move(f.open));
    f.open.clear();
}
void cp_async_wait(int pending) {
    Fiber& f = me();
    while (f.groups.size() > size_t(pending)) {
        for (const AsyncCopy& c : f.groups.front()) std::memcpy(c.dst, c.data, 16);
        f.groups.pop_front();
    }
}

void warp_gather(const void* mine, size_t bytes, void* all) {
    const int self = g_block->cur, lane = self % 32, warp0 = self - lane;
    if (bytes > kWarpSlot) die(where(*g_block) + ": warp_gather moves at most 64 bytes a lane");
    std::memcpy(&g_block->xslots[size_t(self) * kWarpSlot], mine, bytes);
    sync_warp(0xffffffffu);
    for (int i = 0; i < 32; i++)
        std::memcpy(static_cast<unsigned char*>(all) + size_t(i) * bytes,
                    &g_block->xslots[size_t(warp0 + i) * kWarpSlot], bytes);
}

void run_kernel(const void* kernel, dim3 grid, dim3 block, size_t smem, const std::function<void()>& body) {
    const uint64_t threads = uint64_t(block.x) * block.y * block.z;
    int max_dyn = 48 << 10;
    {
        std::lock_guard<std::mutex> lock(g_attr_mutex);
        auto it = g_max_dyn_smem.find(kernel);
        if (it != g_max_dyn_smem.end()) max_dyn = std::max(max_dyn, it->second);
    }
    if (threads == 0 || threads > 1024 || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
        grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535) {
        std::fprintf(stderr, "cuemu: launch of grid (%u,%u,%u) x block (%u,%u,%u) is invalid on a GPU\n",
                     grid.x, grid.y, grid.z, block.x, block.y, block.z);
        g_last_error = cudaErrorInvalidConfiguration;
        return;
    }
    if (smem > size_t(max_dyn)) {
        std::fprintf(stderr, "cuemu: %zu bytes of dynamic shared memory, past the kernel's limit of %d%s\n",
                     smem, max_dyn, max_dyn == (48 << 10) ? " (raise it with cudaFuncSetAttribute)" : "");
        g_last_error = cudaErrorInvalidValue;
        return;
    }
    if (g_block != nullptr) die("a kernel launched from inside a kernel");
    static const Order order = order_from_env();
    std::mt19937 rng(12345);
    Block b;
    b.kernel = kernel;
    b.grid = grid;
    b.block = block;
    b.body = &body;
    b.fibers.resize(threads);
    b.slots.assign(threads, 0);
    b.xslots.assign(threads * kWarpSlot, 0);
    // a GPU's dynamic shared memory starts on a large boundary: the alignment rules (16 bytes for ldmatrix
    // and the 16-byte packs) are checked against it
    b.smem_bytes = std::max<size_t>(smem, 16);
    b.smem_buf.resize(b.smem_bytes + 1024);
    b.smem = b.smem_buf.data() + (1024 - reinterpret_cast<uintptr_t>(b.smem_buf.data()) % 1024);
    g_block = &b;
    const FPControl fp;  // a GPU's rounding, denormals kept, whatever the launching thread had set
    const uint64_t blocks = uint64_t(grid.x) * grid.y * grid.z;
    for (uint64_t k = 0; k < blocks; k++) {
        const uint64_t i = order == Order::Reverse ? blocks - 1 - k : k;
        b.bid = uint3{unsigned(i % grid.x), unsigned(i / grid.x % grid.y),
                      unsigned(i / (uint64_t(grid.x) * grid.y))};
        std::fill(b.smem, b.smem + b.smem_bytes, 0xFF);  // shared memory starts as garbage
        for (const auto& [array, bytes] : g_static_smem[kernel]) std::memset(array, 0xFF, bytes);
        run_block(b, order, rng);
    }
    g_block = nullptr;
}

}  // namespace cuemu

// ---- the CUDA runtime ----

namespace {

constexpr size_t kDeviceBytes = size_t(80) << 30;
std::mutex g_mem_mutex;
std::map<void*, size_t> g_allocs;
size_t g_allocated = 0;

struct Event {
    std::chrono::steady_clock::time_point t = std::chrono::steady_clock::now();
};

}  // namespace

extern "C" {

cudaError_t cudaMalloc(void** p, size_t bytes) {
    if (cuemu::capture_refuses("cudaMalloc")) return cudaErrorStreamCaptureUnsupported;
    const size_t n = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
    std::lock_guard<std::mutex> lock(g_mem_mutex);
    if (g_allocated + n > kDeviceBytes) return cudaErrorMemoryAllocation;
    *p = std::aligned_alloc(256, n);
    if (*p == nullptr) return cudaErrorMemoryAllocation;
    std::memset(*p, 0xFF, n);  // never-written memory reads as NaN
    g_allocs[*p] = n;
    g_allocated += n;
    return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
    if (cuemu::capture_refuses("cudaFree")) return cudaErrorStreamCaptureUnsupported;
    if (p == nullptr) return cudaSuccess;
    std::lock_guard<std::mutex> lock(g_mem_mutex);
    auto it = g_allocs.find(p);
    if (it == g_allocs.end()) return cudaErrorInvalidValue;
    g_allocated -= it->second;
    g_allocs.erase(it);
    std::free(p);
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) {
    if (cuemu::capture_refuses("cudaHostAlloc")) return cudaErrorStreamCaptureUnsupported;
    *p = std::aligned_alloc(256, (std::max<size_t>(bytes, 1) + 255) / 256 * 256);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFreeHost(void* p) {
    if (cuemu::capture_refuses("cudaFreeHost")) return cudaErrorStreamCaptureUnsupported;
    std::free(p);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
    std::lock_guard<std::mutex> lock(g_mem_mutex);
    *total = kDeviceBytes;
    *free_bytes = kDeviceBytes - g_allocated;
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind, cudaStream_t s) {
    if (n) cuemu::enqueue(s, [=] { std::memmove(dst, src, n); });
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t n, cudaStream_t s) {
    if (n) cuemu::enqueue(s, [=] { std::memset(p, value, n); });
    return cudaSuccess;
}
// `height` rows of `width` bytes, `pitch` bytes apart (a pitch below the width is an error, as on a GPU)
cudaError_t cudaMemset2DAsync(void* p, size_t pitch, int value, size_t width, size_t height, cudaStream_t s) {
    if (pitch < width) return cudaErrorInvalidPitchValue;
    cuemu::enqueue(s, [=] {
        for (size_t r = 0; r < height; r++) std::memset(static_cast<char*>(p) + r * pitch, value, width);
    });
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* s) {
    *s = reinterpret_cast<cudaStream_t>(new char);
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) {
    return cudaStreamCreate(s);
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    delete reinterpret_cast<char*>(s);
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) {
    if (cuemu::capture_refuses("cudaStreamSynchronize")) return cudaErrorStreamCaptureUnsupported;
    return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int) {
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) {
    *e = reinterpret_cast<cudaEvent_t>(new Event);
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) {
    return cudaEventCreate(e);
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    delete reinterpret_cast<Event*>(e);
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    cuemu::enqueue(s, [e] { reinterpret_cast<Event*>(e)->t = std::chrono::steady_clock::now(); });
    return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t) {
    if (cuemu::capture_refuses("cudaEventQuery")) return cudaErrorStreamCaptureUnsupported;
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) {
    if (cuemu::capture_refuses("cudaEventSynchronize")) return cudaErrorStreamCaptureUnsupported;
    return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
    *ms = std::chrono::duration<float, std::milli>(reinterpret_cast<Event*>(b)->t -
                                                   reinterpret_cast<Event*>(a)->t)
              .count();
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int d) {
    return d == 0 ? cudaSuccess : cudaErrorInvalidDevice;
}
cudaError_t cudaGetDeviceCount(int* n) {
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
    if (d != 0) return cudaErrorInvalidDevice;
    *p = cudaDeviceProp{};
    std::snprintf(p->name, sizeof p->name, "cuemu (CPU emulation of an sm_90 device)");
    p->totalGlobalMem = kDeviceBytes;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 132;
    p->sharedMemPerBlock = 48 << 10;
    p->sharedMemPerBlockOptin = cuemu::smem_optin();
    p->maxThreadsPerBlock = 1024;
    p->warpSize = 32;
    p->memoryBusWidth = 5120;
    p->l2CacheSize = 50 << 20;
    return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void* f, cudaFuncAttribute attr, int value) {
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
    if (size_t(value) > cuemu::smem_optin()) return cudaErrorInvalidValue;
    std::lock_guard<std::mutex> lock(cuemu::g_attr_mutex);
    cuemu::g_max_dyn_smem[f] = value;
    return cudaSuccess;
}
cudaError_t cudaGetLastError() {
    const cudaError_t e = cuemu::g_last_error;
    cuemu::g_last_error = cudaSuccess;
    return e;
}
const char* cudaGetErrorString(cudaError_t e) {
    switch (e) {
        case cudaSuccess:
            return "no error";
        case cudaErrorMemoryAllocation:
            return "out of memory";
        case cudaErrorInvalidConfiguration:
            return "invalid configuration argument";
        case cudaErrorInvalidValue:
            return "invalid argument";
        case cudaErrorInvalidDevice:
            return "invalid device ordinal";
        case cudaErrorStreamCaptureUnsupported:
            return "operation not permitted when stream is capturing";
        case cudaErrorStreamCaptureInvalidated:
            return "operation failed due to a previous error during capture";
        default:
            return "cuemu: unexpected error";
    }
}

}  // extern "C"
