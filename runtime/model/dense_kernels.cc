#include "runtime/model/dense_kernels.h"

#include "runtime/model/mixed_precision.h"
#include "runtime/model/weight_gradients.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

namespace pipetrain::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// oneDNN's C API: row-major C = alpha * op(A) * op(B) + beta * C; returns dnnl_success (0).
using OneDnnSgemmFn = int (*)(char transa, char transb, int64_t m, int64_t n, int64_t k,
                              float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                              float beta, float* c, int64_t ldc);
// The CBLAS interface (OpenBLAS's, 32-bit integers): order 101 is row-major, 111 / 112 are
// "no transpose" / "transpose".
using CblasSgemmFn = void (*)(int order, int transa, int transb, int m, int n, int k, float alpha,
                              const float* a, int lda, const float* b, int ldb, float beta,
                              float* c, int ldc);

// Both looked up at run time: the build does not depend on how LibTorch was linked.
OneDnnSgemmFn OneDnnSgemm() {
  static const auto fn = reinterpret_cast<OneDnnSgemmFn>(dlsym(RTLD_DEFAULT, "dnnl_sgemm"));
  return fn;
}
CblasSgemmFn OpenBlasSgemm() {
  // Only OpenBLAS's: another CBLAS's rate is unknown to the choice below.
  static const auto fn = dlsym(RTLD_DEFAULT, "openblas_get_config") == nullptr
                             ? nullptr
                             : reinterpret_cast<CblasSgemmFn>(dlsym(RTLD_DEFAULT, "cblas_sgemm"));
  return fn;
}

bool HasAvx512();  // below, with the vectorized GELU

// The default: oneDNN on AVX-512 CPUs (where OpenBLAS 0.3.21 may not know the CPU and fall
// back to AVX2 kernels at half oneDNN's rate), OpenBLAS elsewhere (on an AVX2-only CPU its
// kernels match oneDNN's on the forward products and run the weight gradients' long
// reductions at twice oneDNN's rate; docs/performance.md), else whichever is present.
GemmLibrary DefaultGemmLibrary() {
  const char* choice = std::getenv("PIPETRAIN_GEMM");
  const std::string wanted = choice == nullptr ? "" : choice;
  if (wanted == "aten") return GemmLibrary::kLibTorch;
  if (wanted == "onednn" && GemmLibraryAvailable(GemmLibrary::kOneDnn)) {
    return GemmLibrary::kOneDnn;
  }
  if (wanted == "openblas" && GemmLibraryAvailable(GemmLibrary::kOpenBlas)) {
    return GemmLibrary::kOpenBlas;
  }
  TORCH_CHECK(wanted.empty() || wanted == "onednn" || wanted == "openblas",
              "PIPETRAIN_GEMM=", wanted, " is not one of onednn, openblas, aten");
  if (!wanted.empty()) {
    TORCH_WARN("PIPETRAIN_GEMM=", wanted, ": that library is not in this process; choosing one");
  }
  const GemmLibrary preferred = HasAvx512() ? GemmLibrary::kOneDnn : GemmLibrary::kOpenBlas;
  const GemmLibrary other =
      preferred == GemmLibrary::kOneDnn ? GemmLibrary::kOpenBlas : GemmLibrary::kOneDnn;
  if (GemmLibraryAvailable(preferred)) return preferred;
  if (GemmLibraryAvailable(other)) return other;
  return GemmLibrary::kLibTorch;
}

std::atomic<GemmLibrary>& ChosenLibrary() {
  static std::atomic<GemmLibrary> chosen{DefaultGemmLibrary()};
  return chosen;
}

void Sgemm(char transa, char transb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (ChosenLibrary().load(std::memory_order_relaxed) == GemmLibrary::kOpenBlas) {
    constexpr int64_t kMax = std::numeric_limits<int>::max();
    TORCH_CHECK(std::max({m, n, k, lda, ldb, ldc}) <= kMax,
                "cblas_sgemm: a dimension over 2^31 (m=", m, " n=", n, " k=", k, ")");
    OpenBlasSgemm()(101, transa == 'T' ? 112 : 111, transb == 'T' ? 112 : 111, int(m), int(n),
                    int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
    return;
  }
  const int status = OneDnnSgemm()(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  TORCH_CHECK(status == 0, "dnnl_sgemm failed with status ", status, " (", transa, transb, " m=", m,
              " n=", n, " k=", k, ")");
}

// dyᵀ x2, the weight's gradient of a product with output gradient dy [rows, out] and input
// x2 [rows, in] (both contiguous float32).
at::Tensor SgemmWeightGradient(const at::Tensor& dy, const at::Tensor& x2) {
  const int64_t rows = dy.size(0), out = dy.size(1), in = x2.size(1);
  at::Tensor g = at::empty({out, in}, dy.options());
  Sgemm('T', 'N', out, in, rows, 1.0f, dy.data_ptr<float>(), out, x2.data_ptr<float>(), in, 0.0f,
        g.data_ptr<float>(), in);
  return g;
}

// Under mixed precision (autocast) the work is LibTorch's, in bfloat16.
bool FastPath(const at::Tensor& t) {
  return ChosenLibrary().load(std::memory_order_relaxed) != GemmLibrary::kLibTorch && t.defined() &&
         t.device().is_cpu() && t.scalar_type() == at::kFloat && !t.is_sparse() &&
         !MixedPrecisionOnCpu();
}

// ---------------------------------------------------------------- deferred weight gradients

// A linear product's parameters, remembered in forward when its stage may defer their
// gradients (weight_gradients.h).
void RememberParameters(AutogradContext* ctx, WeightGradientDeferral* deferral,
                        const at::Tensor& weight, const at::Tensor& bias) {
  if (deferral == nullptr) return;
  ctx->saved_data["deferral"] = reinterpret_cast<int64_t>(deferral);
  ctx->saved_data["weight"] = weight;
  ctx->saved_data["bias"] = bias;
}

// In backward: the queue the parameters' gradients go to now, or null (compute them at once).
WeightGradientQueue* DeferringTo(AutogradContext* ctx) {
  auto it = ctx->saved_data.find("deferral");
  if (it == ctx->saved_data.end()) return nullptr;
  return reinterpret_cast<WeightGradientDeferral*>(it->second.toInt())->queue();
}

// The gradients of a linear product's weight (input 1) and bias (input 2, if `has_bias`), made
// by `compute_weight` and `compute_bias`: while the stage defers them, queued to be added to
// the parameters when W runs (and returned undefined), else computed where needed.
std::pair<at::Tensor, at::Tensor> ParameterGradients(AutogradContext* ctx, bool has_bias,
                                                     std::function<at::Tensor()> compute_weight,
                                                     std::function<at::Tensor()> compute_bias) {
  const bool weight_grad = ctx->needs_input_grad(1);
  const bool bias_grad = has_bias && ctx->needs_input_grad(2);
  if (WeightGradientQueue* queue = DeferringTo(ctx)) {
    const at::Tensor weight = ctx->saved_data["weight"].toTensor();
    const at::Tensor bias = ctx->saved_data["bias"].toTensor();
    queue->Defer([weight, bias, weight_grad, bias_grad, compute_weight = std::move(compute_weight),
                  compute_bias = std::move(compute_bias)] {
      if (weight_grad) AccumulateGradient(weight, compute_weight());
      if (bias_grad) AccumulateGradient(bias, compute_bias());
    });
    return {};
  }
  return {weight_grad ? compute_weight() : at::Tensor(), bias_grad ? compute_bias() : at::Tensor()};
}

// ---------------------------------------------------------------- Linear

// x[..., in] weightᵀ + bias by LibTorch's operators, for the paths the fast path does not
// take, as an autograd function whose weight gradients can be deferred. Its products are
// those at::linear's autograd runs (dx = dy w, dw = dyᵀ x, db = Σ dy), written out.
struct ComposedLinear : public torch::autograd::Function<ComposedLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, WeightGradientDeferral* deferral) {
    const bool has_bias = bias.numel() > 0;
    ctx->save_for_backward({x, weight});
    ctx->saved_data["has_bias"] = has_bias;
    RememberParameters(ctx, deferral, weight, bias);
    return at::linear(x, weight, has_bias ? bias : at::Tensor());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& w = saved[1];
    const int64_t in = w.size(1), out = w.size(0);
    const at::Tensor dy = grad_outputs[0].reshape({-1, out});
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    at::Tensor dx;
    if (ctx->needs_input_grad(0)) dx = dy.mm(w).view(x.sizes());
    auto [dw, db] = ParameterGradients(
        ctx, has_bias, [dy, x2 = x.reshape({-1, in})] { return dy.t().mm(x2); },
        [dy] { return dy.sum(0); });
    return {dx, dw, db, at::Tensor()};
  }
};

// Without a bias, `bias` is an empty tensor (autograd functions take no undefined inputs).
struct SgemmLinear : public torch::autograd::Function<SgemmLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, WeightGradientDeferral* deferral) {
    const bool has_bias = bias.numel() > 0;
    const int64_t in = weight.size(1), out = weight.size(0);
    const at::Tensor x2 = x.reshape({-1, in}).contiguous();
    const at::Tensor w = weight.contiguous();
    const int64_t rows = x2.size(0);
    at::Tensor y = at::empty({rows, out}, x.options());
    float beta = 0;
    if (has_bias) {
      y.copy_(bias.expand({rows, out}));
      beta = 1;
    }
    Sgemm('N', 'T', rows, out, in, 1.0f, x2.data_ptr<float>(), in, w.data_ptr<float>(), in, beta,
          y.data_ptr<float>(), out);
    ctx->save_for_backward({x2, w});
    ctx->saved_data["has_bias"] = has_bias;
    RememberParameters(ctx, deferral, weight, bias);
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = out;
    return y.view(shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x2 = saved[0];
    const at::Tensor& w = saved[1];
    const int64_t rows = x2.size(0), in = w.size(1), out = w.size(0);
    const at::Tensor dy = grad_outputs[0].reshape({rows, out}).contiguous();
    at::Tensor dx;
    if (ctx->needs_input_grad(0)) {
      dx = at::empty({rows, in}, dy.options());
      Sgemm('N', 'N', rows, in, out, 1.0f, dy.data_ptr<float>(), out, w.data_ptr<float>(), in, 0.0f,
            dx.data_ptr<float>(), in);
      std::vector<int64_t> shape = grad_outputs[0].sizes().vec();
      shape.back() = in;
      dx = dx.view(shape);
    }
    auto [dw, db] = ParameterGradients(
        ctx, ctx->saved_data["has_bias"].toBool(), [dy, x2] { return SgemmWeightGradient(dy, x2); },
        [dy] { return dy.sum(0); });
    return {dx, dw, db, at::Tensor()};
  }
};

// ---------------------------------------------------------------- GELU

// gelu(x) = x * Φ(x) = 0.5 x (1 + erf(x / sqrt 2)), and its derivative Φ(x) + x φ(x), on
// float32 in one vectorized pass each. erf is a rational approximation on [-4, 4] (outside
// it erf is ±1 in float32) with an absolute error below 5e-7; exp of a non-positive argument
// is a degree-6 polynomial after range reduction. Written as plain loops that the compiler
// vectorizes for AVX-512 (chosen at run time); other CPUs take LibTorch's GELU (the same
// loops compiled for AVX2 made a one-stage step of the peers' GPT about 12% slower than
// LibTorch's AVX2 GELU did).

#define PT_INLINE static inline __attribute__((always_inline))

PT_INLINE float Erf(float a) {
  const float x = a > 4.0f ? 4.0f : (a < -4.0f ? -4.0f : a);
  const float x2 = x * x;
  float p = -2.72614225801306e-10f;
  p = p * x2 + 2.77068142495902e-08f;
  p = p * x2 - 2.10102402082508e-06f;
  p = p * x2 - 5.69250639462346e-05f;
  p = p * x2 - 7.34990630326855e-04f;
  p = p * x2 - 2.95459980854025e-03f;
  p = p * x2 - 1.60960333262415e-02f;
  float q = -1.45660718464996e-05f;
  q = q * x2 - 2.13374055278905e-04f;
  q = q * x2 - 1.68282697438203e-03f;
  q = q * x2 - 7.37332916720468e-03f;
  q = q * x2 - 1.42647390514189e-02f;
  return x * p / q;
}

// exp(x) for x <= 0 (below -87, exp(-87)).
PT_INLINE float ExpNonPositive(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float round_to_integer = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (x * 1.44269504088896341f + round_to_integer) - round_to_integer;
  const float r = (x - n * 0.693145751953125f) - n * 1.428606765330187e-06f;  // |r| <= ln2/2
  float p = 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n, n >= -126
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

constexpr float kSqrtHalf = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

// h[i, j] += bias[j]; y[i, j] = gelu(h[i, j]) for rows [begin, end) of `cols` columns.
PT_INLINE void BiasGeluRows(float* __restrict h, const float* __restrict bias, float* __restrict y,
                            int64_t begin, int64_t end, int64_t cols) {
  for (int64_t r = begin; r < end; ++r) {
    float* __restrict hr = h + r * cols;
    float* __restrict yr = y + r * cols;
    for (int64_t j = 0; j < cols; ++j) {
      const float x = hr[j] + bias[j];
      hr[j] = x;
      yr[j] = 0.5f * x * (1.0f + Erf(x * kSqrtHalf));
    }
  }
}

// dh[i] = dy[i] * gelu'(h[i]) for i in [begin, end).
PT_INLINE void GeluBackwardRange(const float* __restrict dy, const float* __restrict h,
                                 float* __restrict dh, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    const float x = h[i];
    const float cdf = 0.5f * (1.0f + Erf(x * kSqrtHalf));
    const float pdf = ExpNonPositive(-0.5f * x * x) * kInvSqrt2Pi;
    dh[i] = dy[i] * (cdf + x * pdf);
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
#define PT_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx2,fma")))
PT_AVX512 void BiasGeluRowsAvx512(float* h, const float* bias, float* y, int64_t begin, int64_t end,
                                  int64_t cols) {
  BiasGeluRows(h, bias, y, begin, end, cols);
}
PT_AVX512 void GeluBackwardRangeAvx512(const float* dy, const float* h, float* dh, int64_t begin,
                                       int64_t end) {
  GeluBackwardRange(dy, h, dh, begin, end);
}
bool HasAvx512() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
  return has;
}
#else
void BiasGeluRowsAvx512(float*, const float*, float*, int64_t, int64_t, int64_t) {}
void GeluBackwardRangeAvx512(const float*, const float*, float*, int64_t, int64_t) {}
bool HasAvx512() { return false; }
#endif

// Rows of about 64 KiB per task.
int64_t RowsPerTask(int64_t cols) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, cols));
}

// gelu(x weightᵀ + bias), saving x, the weight and the pre-activation for backward.
struct SgemmLinearGelu : public torch::autograd::Function<SgemmLinearGelu> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, WeightGradientDeferral* deferral) {
    const int64_t in = weight.size(1), out = weight.size(0);
    const at::Tensor x2 = x.reshape({-1, in}).contiguous();
    const at::Tensor w = weight.contiguous();
    const at::Tensor b = bias.contiguous();
    const int64_t rows = x2.size(0);
    at::Tensor h = at::empty({rows, out}, x.options());
    at::Tensor y = at::empty({rows, out}, x.options());
    Sgemm('N', 'T', rows, out, in, 1.0f, x2.data_ptr<float>(), in, w.data_ptr<float>(), in, 0.0f,
          h.data_ptr<float>(), out);
    float* hp = h.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    const float* bp = b.data_ptr<float>();
    at::parallel_for(0, rows, RowsPerTask(out), [&](int64_t begin, int64_t end) {
      BiasGeluRowsAvx512(hp, bp, yp, begin, end, out);
    });
    ctx->save_for_backward({x2, w, h});
    RememberParameters(ctx, deferral, weight, bias);
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = out;
    return y.view(shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x2 = saved[0];
    const at::Tensor& w = saved[1];
    const at::Tensor& h = saved[2];
    const int64_t rows = x2.size(0), in = w.size(1), out = w.size(0);
    const at::Tensor dy = grad_outputs[0].reshape({rows, out}).contiguous();
    at::Tensor dh = at::empty({rows, out}, dy.options());
    const float* dyp = dy.data_ptr<float>();
    const float* hp = h.data_ptr<float>();
    float* dhp = dh.data_ptr<float>();
    at::parallel_for(0, rows * out, int64_t{1} << 14, [&](int64_t begin, int64_t end) {
      GeluBackwardRangeAvx512(dyp, hp, dhp, begin, end);
    });
    at::Tensor dx;
    if (ctx->needs_input_grad(0)) {
      dx = at::empty({rows, in}, dy.options());
      Sgemm('N', 'N', rows, in, out, 1.0f, dhp, out, w.data_ptr<float>(), in, 0.0f,
            dx.data_ptr<float>(), in);
      std::vector<int64_t> shape = grad_outputs[0].sizes().vec();
      shape.back() = in;
      dx = dx.view(shape);
    }
    auto [dw, db] = ParameterGradients(
        ctx, /*has_bias=*/true, [dh, x2] { return SgemmWeightGradient(dh, x2); },
        [dh] { return dh.sum(0); });
    return {dx, dw, db, at::Tensor()};
  }
};

// ---------------------------------------------------------------- attention

// Shapes of one attention call: qkv[b, t, 3d], heads h of width hd = d / h.
struct Dims {
  int64_t b, t, d, h, hd;
  int64_t qkv_row() const { return 3 * d; }
  // Offsets of head `bh` = batch * h + head in qkv and in a [b, t, d] tensor.
  int64_t qkv_offset(int64_t bh) const { return (bh / h) * t * 3 * d + (bh % h) * hd; }
  int64_t out_offset(int64_t bh) const { return (bh / h) * t * d + (bh % h) * hd; }
};

Dims DimsOf(const at::Tensor& qkv, int64_t heads) {
  Dims s{qkv.size(0), qkv.size(1), qkv.size(2) / 3, heads, 0};
  s.hd = s.d / heads;
  return s;
}

// About this many floating point operations per task of at::parallel_for.
int64_t HeadsPerTask(const Dims& s) {
  const int64_t per_head = 2 * s.t * s.t * s.hd;
  return std::max<int64_t>(1, (int64_t{1} << 20) / std::max<int64_t>(1, per_head));
}

struct SgemmCausalAttention : public torch::autograd::Function<SgemmCausalAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& qkv_in, int64_t heads) {
    const at::Tensor qkv = qkv_in.contiguous();
    const Dims s = DimsOf(qkv, heads);
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.hd)));
    at::Tensor scores = at::empty({s.b, s.h, s.t, s.t}, qkv.options());
    const float* q = qkv.data_ptr<float>();
    float* sc = scores.data_ptr<float>();
    const float minus_inf = -std::numeric_limits<float>::infinity();
    at::parallel_for(0, s.b * s.h, HeadsPerTask(s), [&](int64_t begin, int64_t end) {
      for (int64_t bh = begin; bh < end; ++bh) {
        const float* qh = q + s.qkv_offset(bh);
        float* out = sc + bh * s.t * s.t;
        // scale * q kᵀ, then the causal mask: query i sees keys 0..i.
        Sgemm('N', 'T', s.t, s.t, s.hd, scale, qh, s.qkv_row(), qh + s.d, s.qkv_row(), 0.0f, out,
              s.t);
        for (int64_t i = 0; i + 1 < s.t; ++i) {
          std::fill(out + i * s.t + i + 1, out + (i + 1) * s.t, minus_inf);
        }
      }
    });
    const at::Tensor probs = at::_softmax(scores, -1, false);
    scores.reset();
    at::Tensor y = at::empty({s.b, s.t, s.d}, qkv.options());
    const float* p = probs.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    at::parallel_for(0, s.b * s.h, HeadsPerTask(s), [&](int64_t begin, int64_t end) {
      for (int64_t bh = begin; bh < end; ++bh) {
        const float* vh = q + s.qkv_offset(bh) + 2 * s.d;
        Sgemm('N', 'N', s.t, s.hd, s.t, 1.0f, p + bh * s.t * s.t, s.t, vh, s.qkv_row(), 0.0f,
              yp + s.out_offset(bh), s.d);
      }
    });
    ctx->save_for_backward({qkv, probs});
    ctx->saved_data["heads"] = heads;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& qkv = saved[0];
    const at::Tensor& probs = saved[1];
    const Dims s = DimsOf(qkv, ctx->saved_data["heads"].toInt());
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.hd)));
    const at::Tensor dy = grad_outputs[0].contiguous();
    at::Tensor dqkv = at::empty_like(qkv);
    at::Tensor dprobs = at::empty_like(probs);
    const float* q = qkv.data_ptr<float>();
    const float* p = probs.data_ptr<float>();
    const float* dyp = dy.data_ptr<float>();
    float* dq = dqkv.data_ptr<float>();
    float* dp = dprobs.data_ptr<float>();
    at::parallel_for(0, s.b * s.h, HeadsPerTask(s), [&](int64_t begin, int64_t end) {
      for (int64_t bh = begin; bh < end; ++bh) {
        const int64_t o = s.qkv_offset(bh);
        const float* dyh = dyp + s.out_offset(bh);
        // d probs = dy vᵀ; d v = probsᵀ dy.
        Sgemm('N', 'T', s.t, s.t, s.hd, 1.0f, dyh, s.d, q + o + 2 * s.d, s.qkv_row(), 0.0f,
              dp + bh * s.t * s.t, s.t);
        Sgemm('T', 'N', s.t, s.hd, s.t, 1.0f, p + bh * s.t * s.t, s.t, dyh, s.d, 0.0f,
              dq + o + 2 * s.d, s.qkv_row());
      }
    });
    // Masked positions have probability 0, so their score gradient is 0.
    const at::Tensor dscores = at::_softmax_backward_data(dprobs, probs, -1, at::kFloat);
    dprobs.reset();
    const float* ds = dscores.data_ptr<float>();
    at::parallel_for(0, s.b * s.h, HeadsPerTask(s), [&](int64_t begin, int64_t end) {
      for (int64_t bh = begin; bh < end; ++bh) {
        const int64_t o = s.qkv_offset(bh);
        const float* dsh = ds + bh * s.t * s.t;
        // d q = scale * d scores k; d k = scale * d scoresᵀ q.
        Sgemm('N', 'N', s.t, s.hd, s.t, scale, dsh, s.t, q + o + s.d, s.qkv_row(), 0.0f, dq + o,
              s.qkv_row());
        Sgemm('T', 'N', s.t, s.hd, s.t, scale, dsh, s.t, q + o, s.qkv_row(), 0.0f, dq + o + s.d,
              s.qkv_row());
      }
    });
    return {dqkv, at::Tensor()};
  }
};

// The same attention composed of LibTorch operators.
at::Tensor ComposedCausalAttention(
    const at::Tensor& qkv, int64_t heads,
    const std::function<at::Tensor(const at::Tensor&)>& on_probabilities) {
  const int64_t b = qkv.size(0), t = qkv.size(1), d = qkv.size(2) / 3, hd = d / heads;
  auto parts = qkv.split(d, -1);
  auto split_heads = [&](const at::Tensor& y) { return y.view({b, t, heads, hd}).transpose(1, 2); };
  at::Tensor q = split_heads(parts[0]), k = split_heads(parts[1]), v = split_heads(parts[2]);
  at::Tensor att = at::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(hd)));
  at::Tensor causal = at::ones({t, t}, qkv.options().dtype(at::kBool)).triu(1);
  // The softmax in float32 at least (under mixed precision the scores are bfloat16).
  const at::ScalarType softmax_dtype =
      att.scalar_type() == at::kBFloat16 || att.scalar_type() == at::kHalf ? at::kFloat
                                                                           : att.scalar_type();
  att = at::softmax(att.masked_fill(causal, -std::numeric_limits<double>::infinity()), -1,
                    softmax_dtype);
  if (on_probabilities) att = on_probabilities(att);
  return at::matmul(att, v).transpose(1, 2).reshape({b, t, d});
}

// Whether the fast path takes x[..., in] times weight[out, in] transposed plus bias[out];
// anything else (including a shape error, which LibTorch then reports) goes to LibTorch.
bool FastLinear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  return FastPath(x) && FastPath(weight) && weight.dim() == 2 && x.dim() >= 1 &&
         x.size(-1) == weight.size(1) &&
         (!bias.defined() || (FastPath(bias) && bias.dim() == 1 && bias.size(0) == weight.size(0)));
}

}  // namespace

bool GemmLibraryAvailable(GemmLibrary library) {
  switch (library) {
    case GemmLibrary::kLibTorch: return true;
    case GemmLibrary::kOneDnn: return OneDnnSgemm() != nullptr;
    case GemmLibrary::kOpenBlas: return OpenBlasSgemm() != nullptr;
  }
  return false;
}

GemmLibrary UsedGemmLibrary() { return ChosenLibrary().load(); }

void UseGemmLibrary(GemmLibrary library) {
  TORCH_CHECK(GemmLibraryAvailable(library), "UseGemmLibrary: ", GemmLibraryName(library),
              " is not in this process");
  ChosenLibrary().store(library);
}

const char* GemmLibraryName(GemmLibrary library) {
  switch (library) {
    case GemmLibrary::kLibTorch: return "aten";
    case GemmLibrary::kOneDnn: return "onednn";
    case GemmLibrary::kOpenBlas: return "openblas";
  }
  return "unknown";
}

at::Tensor Linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                  WeightGradientDeferral* deferral) {
  const at::Tensor bias_or_empty = bias.defined() ? bias : at::empty({0}, weight.options());
  if (!FastLinear(x, weight, bias)) {
    // Autocast casts at::linear's operands; a function of ours would take them as they are.
    if (deferral == nullptr || at::autocast::is_enabled() || at::autocast::is_cpu_enabled() ||
        weight.dim() != 2 || x.dim() < 1 || x.size(-1) != weight.size(1)) {
      return at::linear(x, weight, bias);
    }
    return ComposedLinear::apply(x, weight, bias_or_empty, deferral);
  }
  RECORD_FUNCTION("pipetrain::linear", std::vector<c10::IValue>({x, weight}));
  return SgemmLinear::apply(x, weight, bias_or_empty, deferral);
}

at::Tensor LinearGelu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                      WeightGradientDeferral* deferral) {
  if (!HasAvx512() || !bias.defined() || !FastLinear(x, weight, bias)) {
    return at::gelu(Linear(x, weight, bias, deferral));
  }
  RECORD_FUNCTION("pipetrain::linear_gelu", std::vector<c10::IValue>({x, weight}));
  return SgemmLinearGelu::apply(x, weight, bias, deferral);
}

at::Tensor CausalSelfAttention(
    const at::Tensor& qkv, int64_t heads,
    const std::function<at::Tensor(const at::Tensor&)>& on_probabilities) {
  if (on_probabilities || !FastPath(qkv) || qkv.dim() != 3 || heads < 1 || qkv.size(2) % 3 != 0 ||
      (qkv.size(2) / 3) % heads != 0) {
    return ComposedCausalAttention(qkv, heads, on_probabilities);
  }
  RECORD_FUNCTION("pipetrain::causal_self_attention", std::vector<c10::IValue>({qkv}));
  return SgemmCausalAttention::apply(qkv, heads);
}

}  // namespace pipetrain::model
