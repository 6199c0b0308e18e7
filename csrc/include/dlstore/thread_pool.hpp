// A small fixed pool of worker threads running queued tasks; used to keep several reads in flight.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

namespace dlstore {

class ThreadPool {
 public:
  explicit ThreadPool(size_t threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  template <class F>
  auto submit(F&& f) -> std::future<decltype(f())> {
    using R = decltype(f());
    auto task = std::make_shared<std::packaged_task<R()>>(std::forward<F>(f));
    std::future<R> fut = task->get_future();
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.emplace_back([task] { (*task)(); });
    }
    cv_.notify_one();
    return fut;
  }
  size_t size() const { return workers_.size(); }

 private:
  void work();
  std::vector<std::thread> workers_;
  std::deque<std::function<void()>> tasks_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
};

// The pool of helper threads the batch functions (Example parsing, JPEG decoding) share in this
// process, with at least `workers` threads, grown on demand. A forked child (a DataLoader worker)
// inherits the pool object but not its threads: it gets a pool of its own, and the inherited one is
// leaked, since destroying it would join threads that do not exist there.
std::shared_ptr<ThreadPool> process_pool(size_t workers);

}  // namespace dlstore
