// A small fixed pool of worker threads running queued tasks; used to keep several reads in flight.
#pragma once

#include <chrono>
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
  // `role` names the threads and the setting that asked for them ("I/O threads (io_threads)"): a thread that
  // cannot start (the process's thread limit, memory for its stack) raises an Error saying so, after
  // stopping those already started, rather than a bare std::system_error.
  explicit ThreadPool(size_t threads, const char* role = "helper threads");
  // Joins the threads once the queued tasks have run (abandon() first: returns at once). In a forked
  // child (a DataLoader worker) the pool was inherited without its threads: it is leaked, since joining
  // them, or destroying a condition variable they waited on, would hang, and destroying a joinable
  // std::thread aborts the process.
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  template <class F>
  auto submit(F&& f) -> std::future<decltype(f())> {
    using R = decltype(f());
    auto task = std::make_shared<std::packaged_task<R()>>(std::forward<F>(f));
    std::future<R> fut = task->get_future();
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->tasks.emplace_back([task] { (*task)(); });
    }
    state_->cv.notify_one();
    return fut;
  }
  size_t size() const { return workers_->size(); }
  // Lets the pool go without waiting for it: the tasks not started are dropped (their futures report
  // a broken promise), and each thread ends on its own once the task it runs returns, which for a
  // read on a hung mount may be never. Its tasks must own what they touch (shared pointers). The
  // destructor then returns at once.
  void abandon() noexcept;
  // Drops the tasks not started (their futures report a broken promise); the threads stay.
  void drop_queued() noexcept;
  // Whether this process started the threads: a forked child (a DataLoader worker) inherits the pool, not its
  // threads, so nothing it queued will ever run there.
  bool ours() const;

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> tasks;
    bool stop = false;
  };
  // Each thread holds the state, so that threads let go by abandon() outlive the pool safely.
  static void work(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
  // On the heap, so that a forked child can leak them (see the destructor).
  std::vector<std::thread>* workers_;
  int owner_;  // the process that started the threads
};

// Waits for each future of `futures` (get() of each item) until `timeout_s` from now (0: no limit); false
// when one is still running then.
template <class Items, class Get>
bool wait_all(Items& futures, double timeout_s, Get get) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (auto& item : futures) {
    auto& f = get(item);
    if (timeout_s <= 0) {
      f.wait();
    } else if (f.wait_until(deadline) != std::future_status::ready) {
      return false;
    }
  }
  return true;
}

// The pool of helper threads the batch functions (Example parsing, JPEG decoding) share in this
// process, with at least `workers` threads, grown on demand. A forked child (a DataLoader worker)
// inherits the pool object but not its threads: it gets a pool of its own, and the inherited one is
// leaked, since destroying it would join threads that do not exist there.
std::shared_ptr<ThreadPool> process_pool(size_t workers);

}  // namespace dlstore
