// The median of a stream of values, kept as they arrive: O(log n) per value, O(1) to read.
// The median of an even count is the mean of the two middle values, as the runner's report
// takes it (runtime/job/report/report.cc).
// Thread-compatible.
#pragma once

#include <cstddef>
#include <functional>
#include <queue>
#include <vector>

namespace pipetrain {

class RunningMedian {
 public:
  void Add(double value) {
    if (low_.empty() || value <= low_.top()) {
      low_.push(value);
    } else {
      high_.push(value);
    }
    // low_ holds the smaller half and at most one value more than high_.
    if (low_.size() > high_.size() + 1) {
      high_.push(low_.top());
      low_.pop();
    } else if (high_.size() > low_.size()) {
      low_.push(high_.top());
      high_.pop();
    }
  }
  size_t size() const { return low_.size() + high_.size(); }
  // 0 while empty.
  double Median() const {
    if (low_.empty()) return 0;
    return low_.size() > high_.size() ? low_.top() : 0.5 * (low_.top() + high_.top());
  }

 private:
  std::priority_queue<double> low_;                                        // max-heap
  std::priority_queue<double, std::vector<double>, std::greater<>> high_;  // min-heap
};

}  // namespace pipetrain
