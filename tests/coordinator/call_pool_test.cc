// CallPool (coordinator/call_pool.h): every call runs, at most max_threads at a time and
// several at once when they wait; the destructor runs what is still queued.
#include "coordinator/call_pool.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace pipetrain::coordinator {
namespace {

// Calls that each wait 5 ms: how many ran, and the most that ran at once.
struct Counters {
  std::atomic<int> ran{0}, running{0}, most{0};
  void Call() {
    const int now = ++running;
    int seen = most.load();
    while (now > seen && !most.compare_exchange_weak(seen, now)) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    --running;
    ++ran;
  }
};

TEST(CallPool, RunsEveryCallAtMostMaxThreadsAtATime) {
  Counters c;
  {
    CallPool pool(8);
    for (int i = 0; i < 400; ++i) pool.Run([&c] { c.Call(); });
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (c.ran.load() < 400 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(c.ran.load(), 400);
    EXPECT_LE(pool.threads(), 8);
  }
  EXPECT_LE(c.most.load(), 8);
  EXPECT_GE(c.most.load(), 4);  // waiting calls overlap (a single thread would give 1)
}

TEST(CallPool, OneThreadRunsCallsOneAtATimeInOrder) {
  std::vector<int> order;
  std::mutex mu;
  {
    CallPool pool(1);
    for (int i = 0; i < 50; ++i) {
      pool.Run([&, i] {
        std::lock_guard<std::mutex> lock(mu);
        order.push_back(i);
      });
    }
  }  // the destructor runs what is queued
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[i], i);
}

TEST(CallPool, TheDestructorRunsEveryQueuedCall) {
  Counters c;
  {
    CallPool pool(2);
    for (int i = 0; i < 40; ++i) pool.Run([&c] { c.Call(); });
  }
  EXPECT_EQ(c.ran.load(), 40);
  EXPECT_LE(c.most.load(), 2);
}

}  // namespace
}  // namespace pipetrain::coordinator
