// cuemu's stream capture (graph.cpp): cudaStreamBeginCapture .. cudaStreamEndCapture record the work queued
// on a stream instead of running it, and cudaGraphLaunch runs the recording. The emulator's stream operations
// (kernel launches, the asynchronous copies and sets, cuBLASLt's products) go through enqueue(); the calls a
// capture cannot hold (a wait for the device, an allocation, a synchronous copy) ask capture_refuses() first,
// which invalidates this thread's capture and fails them as CUDA does in cudaStreamCaptureModeThreadLocal.
#pragma once

#include <cuda_runtime.h>

#include <functional>

namespace cuemu {

// Runs `op` now, or keeps it for the graph when `s` is being captured. Work queued on the legacy default
// stream (null) while this thread captures is reported: on a GPU it would run at once, outside the graph.
void enqueue(cudaStream_t s, std::function<void()> op);
// True when `s` is being captured (and `op`s queued on it are kept).
bool capturing(cudaStream_t s);
// When this thread is capturing: invalidates its capture, says which call did it (CUEMU_CAPTURE_VERBOSE=1)
// and returns true; the caller then fails with cudaErrorStreamCaptureUnsupported. False otherwise.
bool capture_refuses(const char* call);

}  // namespace cuemu
