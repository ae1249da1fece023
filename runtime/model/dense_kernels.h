// The matrix products of the built-in models: a linear layer and causal multi-head
// self-attention, each differentiable by autograd.
//
// For float32 tensors on the CPU they run on a GEMM library called directly (GemmLibrary,
// below: found at run time in the process, LibTorch links both on Debian) with work of their
// own around it: attention skips the copies that a composition of LibTorch operators makes
// (the products read the heads in place from the fused q|k|v projection and write the output
// in place in [batch, time, d] order, and the scale and the causal mask are applied inside the
// product and the softmax), and the fc layer adds its bias and applies GELU in one vectorized
// pass. Every other dtype or device, or a process with neither library, or
// PIPETRAIN_GEMM=aten in the environment (read once per process), takes the composition of
// LibTorch operators that the fast path replaces (at::linear; at::gelu; matmul, masked_fill,
// softmax, matmul), with the same results up to float32 rounding. Double backward
// (create_graph) is not supported on the fast path. Thread-safe; the products use at most the
// calling thread's intra-op threads (OpenBLAS's count as SetIntraOpThreads sets it).
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
// needs AVX-512: it adds the bias and applies GELU in one pass after the
// product (and the derivative in one pass in backward), with erf approximated to an absolute
// error below 5e-7.
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

// The library the fast path's products run on. The default: oneDNN's sgemm on CPUs with
// AVX-512, where OpenBLAS 0.3.21 may not know the CPU and fall back to AVX2 kernels at half
// oneDNN's rate; OpenBLAS's elsewhere, where on an AVX2 CPU it matches oneDNN on the forward
// products and runs the weight gradients' long reductions at twice oneDNN's rate
// (docs/performance.md); the other one if only it is present; LibTorch's operators if
// neither. PIPETRAIN_GEMM=onednn|openblas|aten in the environment overrides the default (a
// library not in the process: a warning and the default; any other value: an error at the
// first product).
enum class GemmLibrary {
  kLibTorch,  // no fast path: LibTorch's operators
  kOneDnn,    // dnnl_sgemm
  kOpenBlas,  // OpenBLAS's cblas_sgemm
};

// "aten", "onednn", "openblas": the names PIPETRAIN_GEMM takes.
const char* GemmLibraryName(GemmLibrary library);

// Whether `library` is in this process (kLibTorch always is).
bool GemmLibraryAvailable(GemmLibrary library);

// The library in use (the default above until UseGemmLibrary).
GemmLibrary UsedGemmLibrary();

// Uses `library` from the next product on, in every thread; for tests and benchmarks that
// compare the libraries in one process. Throws c10::Error if it is not in the process.
void UseGemmLibrary(GemmLibrary library);

}  // namespace pipetrain::model
