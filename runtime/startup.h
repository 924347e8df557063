// Library start-up off the critical path. A process pays some costs once per device before its
// first use of a library: cuBLASLt's handle and the loading of its heuristic's tables took ~100 ms
// per dtype of a warm process's first GEMM on the H200 (docs/BENCHMARKS.md). Layers above the
// runtime register such work as a startup task; the tasks run on one background thread per device
// from that device's first allocation, so they overlap what the program does next (making or
// loading weights, tracing, compiling) instead of delaying its first result. A real use that comes
// first either waits for the library's own lock or does the work itself; it never waits for more.
//
// Tasks do host work only (no kernel, no device memory, no stream of theirs): nothing of them
// shows in a profile, a device timing or the allocator's statistics. They swallow their errors
// (the real use reports them). Process exit waits for running tasks before anything is torn
// down: exit() runs the exiting thread's thread_local destructors before any static destructor
// or atexit handler (a task still inside a library whose statics were destroyed crashed the
// process at exit), and the waiter is armed on the thread that registers, the main thread at
// static initialisation. KILN_STARTUP=off runs no task (the first use pays, as before).
//
//   // ops/cuda/matmul_cuda.cc, at static initialisation:
//   const bool registered = (cuda::RegisterStartupTask(&WarmUpCublasLt), true);
//
// RunInBackground starts one job (a kernel's NVRTC compile that a plan runs a fallback during) on
// a thread of its own under the same exit rule; it is not startup work (StartupMs, WaitForStartup
// leave it out).
#pragma once

#include <functional>

namespace kiln::cuda {

using StartupTask = void (*)(int device);

// Adds a task run once per device, in registration order, at the device's first allocation. Call
// it from a static initialiser (before any device allocation, on the thread that will exit); a
// task registered later runs only for devices first used after it.
void RegisterStartupTask(StartupTask task);

// Starts the registered tasks for `device` on a background thread, once per device (later calls
// return at once). The caching allocator calls it; KILN_STARTUP=off makes it do nothing.
void StartStartupTasks(int device);

// Blocks until every task started so far has finished (at once when none runs, and on a startup
// thread itself).
void WaitForStartup();

// Runs `job` on a background thread now (a job's exceptions are swallowed: it reports through
// what it sets). Process exit waits for it as for a startup task; during static teardown the job
// runs on the calling thread instead.
void RunInBackground(std::function<void()> job);

// Blocks until every job RunInBackground started so far has finished.
void WaitForBackgroundJobs();

// Whether the calling thread is a startup thread (its library start-up is not a compile's).
bool OnStartupThread();

// Milliseconds the startup threads have spent so far, summed over devices, running ones
// included (off the critical path unless something waited for them).
double StartupMs();

}  // namespace kiln::cuda
