// The split backward of zero-bubble schedules (docs/design.md section 3.1): a stage's
// backward of micro-batch j in two parts, I<j> (what the upstream stage waits for: the
// gradient of the stage's input) now, and W<j> (its parameters' gradients) later.
//
// Layers take part through a WeightGradientDeferral their stage owns and hands them in
// LayerContext. While the executor points it at a queue (DeferTo), the backward of the
// deferrable layers (Linear and LinearGelu of dense_kernels.h, on every path but autocast's)
// computes only its input's gradient and queues the weight-gradient product as work that
// holds what it needs (the layer's input and output gradient), no autograd graph; every
// other layer (norms, embeddings, convolutions, TorchScript) computes its parameters'
// gradients in I as before. W runs the queued work of its micro-batch, oldest first, adding
// each gradient to the parameter's .grad as autograd's accumulation does. Each product is
// the one the full backward would run, so I then W leaves the same .grad bits as B.
//
// Thread safety: a deferral and its queues belong to one stage; DeferTo is called by its
// thread between backwards, and a backward (on whichever thread autograd runs it) reads it.
#pragma once

#include <atomic>
#include <functional>
#include <vector>

#include <ATen/core/Tensor.h>

namespace pipetrain::model {

// Deferred weight-gradient work of one micro-batch's backward, oldest first.
class WeightGradientQueue {
 public:
  void Defer(std::function<void()> work) { work_.push_back(std::move(work)); }
  // Runs every deferred work in the order it was deferred and empties the queue.
  void Run();
  bool empty() const { return work_.empty(); }
  size_t size() const { return work_.size(); }

 private:
  std::vector<std::function<void()>> work_;
};

class WeightGradientDeferral {
 public:
  // Backwards from now on queue their weight gradients in `queue` (owned by the caller, alive
  // until they are run); nullptr: compute them at once (the default).
  void DeferTo(WeightGradientQueue* queue) { queue_.store(queue, std::memory_order_release); }
  WeightGradientQueue* queue() const { return queue_.load(std::memory_order_acquire); }

 private:
  std::atomic<WeightGradientQueue*> queue_{nullptr};
};

// While alive, `deferral` queues into `queue`; afterwards it computes at once again.
class DeferWeightGradients {
 public:
  DeferWeightGradients(WeightGradientDeferral& deferral, WeightGradientQueue& queue)
      : deferral_(deferral) {
    deferral_.DeferTo(&queue);
  }
  ~DeferWeightGradients() { deferral_.DeferTo(nullptr); }
  DeferWeightGradients(const DeferWeightGradients&) = delete;
  DeferWeightGradients& operator=(const DeferWeightGradients&) = delete;

 private:
  WeightGradientDeferral& deferral_;
};

// Adds `gradient` to `parameter`'s .grad as autograd's AccumulateGrad does: the first
// gradient becomes .grad, later ones are added in place.
void AccumulateGradient(const at::Tensor& parameter, at::Tensor gradient);

}  // namespace pipetrain::model
