// Background library start-up and jobs (see startup.h): a registry of tasks, a thread per device
// that runs them (and one per background job), the running threads' start times (a wait waits for
// none to be left), a thread_local waiter that makes exit() wait before any teardown, and holders
// that join the threads.
#include "runtime/startup.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "runtime/cuda.h"
#include "runtime/settings.h"

namespace kiln::cuda {
namespace {

constexpr int kMaxDevices = 64;

thread_local bool t_on_startup_thread = false;
std::atomic<bool> g_threads_gone{false};

struct Registry {
  std::mutex mu;
  std::vector<StartupTask> tasks ABSL_GUARDED_BY(mu);
};
Registry& TheRegistry() {
  static auto* r = new Registry;  // never destroyed: registered from static initialisers
  return *r;
}

// The running threads of one kind (startup, background jobs), joined at exit by the destructor
// (a task has finished by then when the exiting thread armed the ExitWaiter).
class Threads {
 public:
  ~Threads() {
    g_threads_gone = true;  // a WaitForStartup during the rest of static teardown returns at once
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> lock(mu_);
      threads.swap(threads_);
    }
    for (std::thread& t : threads) t.join();
  }

  // Runs `work` on a new thread; `startup`: the thread is a startup thread (OnStartupThread).
  void Start(std::function<void()> work, bool startup) {
    std::lock_guard<std::mutex> lock(mu_);
    JoinFinishedLocked();
    const auto t0 = std::chrono::steady_clock::now();
    running_since_.push_back(t0);
    threads_.emplace_back([this, t0, startup, work = std::move(work)] { Run(t0, startup, work); });
  }

  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock,
               [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return running_since_.empty(); });
  }

  double Ms() {  // the finished threads' time, plus the running ones' so far
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    double ms = ms_;
    for (const auto& since : running_since_) {
      ms += std::chrono::duration<double, std::milli>(now - since).count();
    }
    return ms;
  }

 private:
  void Run(std::chrono::steady_clock::time_point t0, bool startup,
           const std::function<void()>& work) {
    t_on_startup_thread = startup;
    // Relaxed: a capture another thread runs in global mode neither refuses the CUDA calls a
    // library makes while starting up (a handle's) nor is broken by them; tasks launch nothing.
    cuda::RelaxCaptureModeForThisThread();
    try {
      work();
    } catch (...) {  // best effort: the real use reports what failed
    }
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::lock_guard<std::mutex> lock(mu_);
    ms_ += ms;
    running_since_.erase(std::find(running_since_.begin(), running_since_.end(), t0));
    finished_.push_back(std::this_thread::get_id());
    if (running_since_.empty()) done_.notify_all();
  }

  // Joins the threads whose work has ended (each background compile is a thread: their handles
  // do not pile up until exit).
  void JoinFinishedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const std::thread::id id : finished_) {
      auto it = std::find_if(threads_.begin(), threads_.end(),
                             [id](const std::thread& t) { return t.get_id() == id; });
      if (it == threads_.end()) continue;
      it->join();  // at most the few instructions after its last lock
      threads_.erase(it);
    }
    finished_.clear();
  }

  std::mutex mu_;
  std::condition_variable done_;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  double ms_ ABSL_GUARDED_BY(mu_) = 0;
  // When each running thread started; empty when none runs.
  std::vector<std::chrono::steady_clock::time_point> running_since_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread::id> finished_ ABSL_GUARDED_BY(mu_);  // ended, not joined yet
};

std::atomic<Threads*> g_threads{nullptr};  // set once by the first start
std::atomic<Threads*> g_jobs{nullptr};     // set once by the first background job

// The background jobs' holder (joined at exit), made by the first job.
Threads& Jobs() {
  static Threads jobs;
  g_jobs.store(&jobs, std::memory_order_release);
  return jobs;
}

// Destroyed by exit() on the thread that armed it before static destructors and atexit handlers
// run (glibc calls the exiting thread's TLS destructors first), so no library a task is inside is
// torn down under it. Armed by RegisterStartupTask: at static initialisation, the main thread.
struct ExitWaiter {
  ~ExitWaiter() {
    WaitForStartup();
    WaitForBackgroundJobs();
  }
};

}  // namespace

void RegisterStartupTask(StartupTask task) {
  thread_local ExitWaiter waiter;
  (void)waiter;
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.tasks.push_back(task);
}

void StartStartupTasks(int device) {
  static std::atomic<bool> started[kMaxDevices]{};
  if (device < 0 || device >= kMaxDevices || started[device].load(std::memory_order_acquire)) {
    return;
  }
  // Nothing starts during static teardown (the holder below may be gone) or with the setting off.
  if (started[device].exchange(true) || g_threads_gone || !EnvBool("KILN_STARTUP")) return;
  std::vector<StartupTask> tasks;
  {
    Registry& r = TheRegistry();
    std::lock_guard<std::mutex> lock(r.mu);
    tasks = r.tasks;
  }
  if (tasks.empty()) return;
  static Threads threads;  // joined at exit
  g_threads.store(&threads, std::memory_order_release);
  threads.Start(
      [device, tasks = std::move(tasks)] {
        for (StartupTask task : tasks) {
          try {
            task(device);
          } catch (...) {  // best effort: the real use reports what failed
          }
        }
      },
      /*startup=*/true);
}

void RunInBackground(std::function<void()> job) {
  if (g_threads_gone) {  // static teardown: the holders may be gone
    try {
      job();
    } catch (...) {
    }
    return;
  }
  Jobs().Start(std::move(job), /*startup=*/false);
}

void WaitForBackgroundJobs() {
  Threads* jobs = g_jobs.load(std::memory_order_acquire);
  if (jobs == nullptr || g_threads_gone) return;
  jobs->Wait();
}

void WaitForStartup() {
  Threads* threads = g_threads.load(std::memory_order_acquire);
  if (threads == nullptr || t_on_startup_thread || g_threads_gone) return;
  threads->Wait();
}

bool OnStartupThread() { return t_on_startup_thread; }

double StartupMs() {
  Threads* threads = g_threads.load(std::memory_order_acquire);
  return threads == nullptr || g_threads_gone ? 0 : threads->Ms();
}

}  // namespace kiln::cuda
