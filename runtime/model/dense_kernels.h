// The matrix products of the built-in models: a linear layer and causal multi-head
// self-attention, each differentiable by autograd.
//
// For float32 tensors on the CPU they run on oneDNN's sgemm (dnnl_sgemm, found at run time
// in the process: LibTorch links oneDNN on Debian) instead of LibTorch's BLAS. On CPUs that
// the BLAS does not recognize, the BLAS falls back to older vector kernels while oneDNN
// picks its kernels by instruction set: on an AVX-512 machine whose CPU OpenBLAS 0.3.21
// does not know, oneDNN's sgemm runs at twice OpenBLAS's rate (docs/performance.md).
// Attention also skips the copies that a composition of LibTorch operators makes: the
// products read the heads in place from the fused q|k|v projection and write the output in
// place in [batch, time, d] order, and the scale and the causal mask are applied inside the
// product and the softmax.
// Every other dtype or device, or a process without oneDNN, or PIPETRAIN_GEMM=aten in the
// environment (read once per process), takes the composition of LibTorch operators that the
// fast path replaces (at::linear; at::gelu; matmul, masked_fill, softmax, matmul), with the
// same results up to float32 rounding. Double backward (create_graph) is not supported on the
// fast path. Thread-safe; the products use at most the calling thread's intra-op threads.
#pragma once

#include <cstdint>
#include <functional>

#include <ATen/core/Tensor.h>

namespace pipetrain::model {

class WeightGradientDeferral;  // weight_gradients.h

// x[..., in] times weight[out, in] transposed, plus bias[out] if defined.
// With a `deferral` (a stage's, weight_gradients.h) the product is an autograd function of
// this file on every path but autocast's (on the composed path too: forward at::linear,
// backward its three products written out), whose backward queues the weight's and the bias's
// gradients while the deferral points at a queue: `weight` and `bias` must then be the
// parameters themselves (leaves), whose .grad the queued work adds to.
at::Tensor Linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                  WeightGradientDeferral* deferral = nullptr);

// gelu(Linear(x, weight, bias)), the exact (erf) GELU, with bias[out]. The fast path also
// needs AVX-512: it adds the bias and applies GELU in one pass after the product (and the
// derivative in one pass in backward), with erf approximated to an absolute error below 5e-7.
// `deferral` as for Linear.
at::Tensor LinearGelu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                      WeightGradientDeferral* deferral = nullptr);

// qkv[b, t, 3d]: queries, keys and values side by side (d = heads * head_dim), as a fused
// projection makes them. Returns softmax(q kᵀ / sqrt(head_dim) + causal mask) v for every
// head, heads concatenated: [b, t, d]. Position i attends to positions 0..i.
// `on_probabilities` (dropout), if given, maps the probabilities [b, heads, t, t] before they
// weigh the values; it takes the composed path.
at::Tensor CausalSelfAttention(
    const at::Tensor& qkv, int64_t heads,
    const std::function<at::Tensor(const at::Tensor&)>& on_probabilities = nullptr);

// Whether the fast path serves float32 CPU tensors in this process.
bool UsesOneDnnSgemm();

}  // namespace pipetrain::model
