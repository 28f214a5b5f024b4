// cuemu's stream capture and graphs (capture.h): a capture keeps what is queued on its stream, in order, as
// closures over the arguments of the moment (a kernel's parameters, a product's descriptors and host
// scalars); a graph is that list, and launching it runs the list on the calling thread, as every emulated
// stream does. What a GPU's capture refuses in cudaStreamCaptureModeThreadLocal (a wait for the device, an
// allocation, a synchronous copy) invalidates it here too, so code that records on the card records under the
// emulator.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "capture.h"

struct CUgraph_st {
    std::vector<std::function<void()>> ops;
};
struct CUgraphExec_st {
    std::vector<std::function<void()>> ops;
};

namespace cuemu {
namespace {

struct Capture {
    std::thread::id thread;
    bool invalidated = false;
    std::vector<std::function<void()>> ops;
};

std::mutex g_capture_mutex;
std::map<cudaStream_t, Capture> g_captures;  // the streams being captured

[[noreturn]] void die(const std::string& what) {
    std::fprintf(stderr, "cuemu: %s\n", what.c_str());
    std::fflush(stderr);
    std::abort();
}

// this thread's capture, or null (the lock held)
Capture* own_capture() {
    for (auto& [s, c] : g_captures)
        if (c.thread == std::this_thread::get_id()) return &c;
    return nullptr;
}

}  // namespace

void enqueue(cudaStream_t s, std::function<void()> op) {
    {
        std::lock_guard<std::mutex> lock(g_capture_mutex);
        if (auto it = g_captures.find(s); it != g_captures.end()) {
            if (!it->second.invalidated) it->second.ops.push_back(std::move(op));
            return;
        }
        if (s == nullptr && own_capture())
            die("work queued on the default stream while this thread captures another: on a GPU it would run "
                "at once, outside the graph");
    }
    op();
}

bool capturing(cudaStream_t s) {
    std::lock_guard<std::mutex> lock(g_capture_mutex);
    return g_captures.count(s) != 0;
}

bool capture_refuses(const char* call) {
    std::lock_guard<std::mutex> lock(g_capture_mutex);
    Capture* c = own_capture();
    if (!c) return false;
    c->invalidated = true;
    static const bool verbose = [] {
        const char* e = std::getenv("CUEMU_CAPTURE_VERBOSE");
        return e && *e && std::string(e) != "0";
    }();
    if (verbose) std::fprintf(stderr, "cuemu: %s during a stream capture invalidates it\n", call);
    return true;
}

}  // namespace cuemu

extern "C" {

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
    using namespace cuemu;
    if (mode != cudaStreamCaptureModeThreadLocal)  // what anvil asks; the others' rules are not emulated
        die("cudaStreamBeginCapture: only cudaStreamCaptureModeThreadLocal is emulated");
    if (s == nullptr) return cudaErrorStreamCaptureImplicit;  // the legacy stream cannot be captured
    std::lock_guard<std::mutex> lock(g_capture_mutex);
    if (g_captures.count(s)) return cudaErrorIllegalState;
    g_captures[s] = Capture{std::this_thread::get_id(), false, {}};
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
    using namespace cuemu;
    std::lock_guard<std::mutex> lock(g_capture_mutex);
    auto it = g_captures.find(s);
    *graph = nullptr;
    if (it == g_captures.end()) return cudaErrorIllegalState;
    const bool invalidated = it->second.invalidated;
    if (!invalidated) *graph = new CUgraph_st{std::move(it->second.ops)};
    g_captures.erase(it);
    return invalidated ? cudaErrorStreamCaptureInvalidated : cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
    using namespace cuemu;
    std::lock_guard<std::mutex> lock(g_capture_mutex);
    auto it = g_captures.find(s);
    *status = it == g_captures.end()   ? cudaStreamCaptureStatusNone
              : it->second.invalidated ? cudaStreamCaptureStatusInvalidated
                                       : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
    if (graph == nullptr) return cudaErrorInvalidValue;
    *exec = new CUgraphExec_st{graph->ops};
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
    if (exec == nullptr) return cudaErrorInvalidValue;
    for (const auto& op : exec->ops) cuemu::enqueue(s, op);
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    delete graph;
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    delete exec;
    return cudaSuccess;
}

}  // extern "C"
