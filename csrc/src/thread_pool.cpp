#include "dlstore/thread_pool.hpp"

#include <unistd.h>

#include <string>
#include <system_error>

#include "dlstore/error.hpp"

namespace dlstore {

ThreadPool::ThreadPool(size_t threads, const char* role)
    : state_(std::make_shared<State>()), workers_(new std::vector<std::thread>), owner_(static_cast<int>(getpid())) {
  if (threads == 0) threads = 1;
  try {
    workers_->reserve(threads);
    for (size_t i = 0; i < threads; ++i) workers_->emplace_back(work, state_);
  } catch (const std::system_error& e) {
    // The destructor does not run for a constructor that throws: stop and join the threads started,
    // which would otherwise wait for tasks forever (and a joinable std::thread destroyed aborts).
    const size_t started = workers_->size();
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->stop = true;
    }
    state_->cv.notify_all();
    for (auto& t : *workers_) t.join();
    delete workers_;
    Error err(ErrorKind::Generic,
              "could not start " + std::string(role) + ": thread " + std::to_string(started + 1) + " of " +
                  std::to_string(threads) + " failed (" + e.code().message() + ", errno " +
                  std::to_string(e.code().value()) +
                  "); this process may start fewer threads (ulimit -u, the cgroup's pids.max, memory for "
                  "their stacks): ask for fewer");
    err.err = e.code().value();
    throw err;
  }
}

ThreadPool::~ThreadPool() {
  // A forked child: leaked on purpose (see the header); the state's count is the parent's threads' too.
  if (static_cast<int>(getpid()) != owner_) return;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
  }
  state_->cv.notify_all();
  for (auto& t : *workers_) t.join();
  delete workers_;
}

void ThreadPool::abandon() noexcept {
  if (static_cast<int>(getpid()) != owner_) return;
  std::deque<std::function<void()>> dropped;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
    dropped.swap(state_->tasks);  // destroyed below, outside the lock: they may own files and buffers
  }
  state_->cv.notify_all();
  for (auto& t : *workers_) t.detach();
  workers_->clear();
  dropped.clear();
}

bool ThreadPool::ours() const { return static_cast<int>(getpid()) == owner_; }

void ThreadPool::drop_queued() noexcept {
  if (!ours()) return;  // its lock may have been held by a thread of the parent at the fork
  std::deque<std::function<void()>> dropped;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    dropped.swap(state_->tasks);  // destroyed outside the lock: they may own files and buffers
  }
}

void ThreadPool::work(std::shared_ptr<State> state) {
  State& s = *state;
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(s.mu);
      s.cv.wait(lock, [&s] { return s.stop || !s.tasks.empty(); });
      if (s.tasks.empty()) return;  // stop and drained: queued tasks run (but abandon() drops them)
      task = std::move(s.tasks.front());
      s.tasks.pop_front();
    }
    task();
  }
}

std::shared_ptr<ThreadPool> process_pool(size_t workers) {
  static std::mutex mu;
  static std::shared_ptr<ThreadPool>* pool = nullptr;  // leaked on purpose: see the header, and exit order
  static pid_t owner = 0;
  std::lock_guard<std::mutex> lock(mu);
  const pid_t self = getpid();
  if (pool != nullptr && owner != self) pool = nullptr;  // a forked child: leak the parent's pool
  if (pool == nullptr) pool = new std::shared_ptr<ThreadPool>();
  if (!*pool || (*pool)->size() < workers) {
    // Callers still running on the old pool hold references; it is joined when they let go.
    *pool = std::make_shared<ThreadPool>(workers, "helper threads (a batch function's threads)");
    owner = self;
  }
  return *pool;
}

}  // namespace dlstore
