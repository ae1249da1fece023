// The split backward of zero-bubble schedules (docs/design.md section 3.1): a stage's
// backward of micro-batch j in two parts, I<j> (what the upstream stage waits for: the
// gradient of the stage's input) now, and W<j> (its parameters' gradients) later.
//
// Layers take part through a WeightGradientDeferral their stage owns and hands them in
// LayerContext. While the executor points it at a queue (DeferTo), a backward computes only
// its input's gradient and queues its parameters' gradients as work, by one of two paths:
//   - the linear products of dense_kernels.h (Linear, LinearGelu, on every path but
//     autocast's) queue their weight-gradient product with what it needs (the layer's input
//     and output gradient), no autograd graph;
//   - the other operations with parameters (layer norms, embeddings, convolutions,
//     TorchScript modules) go through SplitBackward below, when the deferral splits
//     (set_splits): autograd over the operation's own graph, kept until W. Not batch norms:
//     their parameters' gradients are per-channel sums that their input's gradient computes
//     anyway, and W would only make that pass again.
// W runs the queued work of its micro-batch, oldest first, adding each gradient to the
// parameter's .grad as autograd's accumulation does. Each product is the one the full
// backward would run, so I then W leaves the same .grad bits as B.
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
  // Whether the stage's backwards may be split (a schedule with I and W): only then do
  // forwards record the generic path (SplitBackward), which costs an autograd node and a
  // nested backward per operation. Set before the forwards; default false.
  void set_splits(bool splits) { splits_ = splits; }
  bool splits() const { return splits_; }

  // Backwards from now on queue their weight gradients in `queue` (owned by the caller, alive
  // until they are run); nullptr: compute them at once (the default).
  void DeferTo(WeightGradientQueue* queue) { queue_.store(queue, std::memory_order_release); }
  WeightGradientQueue* queue() const { return queue_.load(std::memory_order_acquire); }

 private:
  std::atomic<WeightGradientQueue*> queue_{nullptr};
  bool splits_ = false;
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

// The generic path: fn(input), an operation of `parameters` (leaves: the layer's own) that
// autograd records, as one autograd node whose backward
//   - while `deferral` queues: computes only `input`'s gradient (autograd through fn's graph,
//     the parameters' branches masked off) and queues the parameters' (the same graph again,
//     kept until W, the input's branches masked off);
//   - otherwise: both at once, as fn's own backward.
// The kernels that run are the full backward's with some outputs masked off (a norm's or a
// convolution's backward computes its input's and its weights' gradients apart), so the bits
// are the same. Nodes of fn's graph that both gradients pass through run twice: wrap the
// smallest operation that holds parameters (one op; a TorchScript module is wrapped whole).
// Returns fn(input) unwrapped without `deferral`, when it does not split, or without grad
// mode. An input that is not floating point (token ids) gets no gradient; a parameter used
// twice in fn gets the sum of its uses once.
at::Tensor SplitBackward(const at::Tensor& input, const std::vector<at::Tensor>& parameters,
                         WeightGradientDeferral* deferral,
                         const std::function<at::Tensor(const at::Tensor&)>& fn);

// Adds `gradient` to `parameter`'s .grad as autograd's AccumulateGrad does: the first
// gradient becomes .grad, later ones are added in place.
void AccumulateGradient(const at::Tensor& parameter, at::Tensor gradient);

}  // namespace pipetrain::model
