// The coordinator's calls to workers (assignments, stops), run off its lock by a bounded pool
// of threads in the order they were queued. A job of 4,096 ranks queues 4,096 assignments at
// once: a thread per call would start 4,096 threads together (and starve the threads that
// answer heartbeats, so that workers were taken for lost); the pool runs them `max_threads`
// at a time, each call bounded by its own RPC deadline (worker_client.h).
//
// Threads start while more calls wait than threads are idle, up to `max_threads`, and then
// stay. Thread-
// safe. The destructor runs every call still queued, then joins the threads.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace pipetrain::coordinator {

class CallPool {
 public:
  explicit CallPool(int max_threads) : max_threads_(max_threads < 1 ? 1 : max_threads) {}
  ~CallPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    ready_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  CallPool(const CallPool&) = delete;
  CallPool& operator=(const CallPool&) = delete;

  // Queues `call`; it runs on one of the pool's threads.
  void Run(std::function<void()> call) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(call));
    // More calls waiting than idle threads to take them: another thread, while allowed.
    if (static_cast<int>(queue_.size()) > idle_ &&
        static_cast<int>(threads_.size()) < max_threads_) {
      threads_.emplace_back([this] { Loop(); });
    }
    ready_.notify_one();
  }

  // Threads started so far (at most max_threads).
  int threads() const {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(threads_.size());
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      ++idle_;
      ready_.wait(lock, [this] { return !queue_.empty() || stopping_; });
      --idle_;
      if (queue_.empty()) return;  // stopping, nothing left
      std::function<void()> call = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      call();
      lock.lock();
    }
  }

  const int max_threads_;
  mutable std::mutex mu_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> queue_;
  std::vector<std::thread> threads_;
  int idle_ = 0;  // threads waiting for a call
  bool stopping_ = false;
};

}  // namespace pipetrain::coordinator
