// The float32 fast path of runtime/model/dense_kernels.h, on each GEMM library in the process
// (oneDNN's and OpenBLAS's sgemm; LibTorch's operators as the path without one), against the
// composition of LibTorch operators it replaces, run in float64: outputs and gradients agree
// to float32 rounding, for the shapes and layouts the built-in models produce and a few they
// do not (non-contiguous inputs, no bias, a gradient for only some inputs).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <exception>
#include <string>
#include <vector>

#include "runtime/model/dense_kernels.h"

namespace pipetrain::model {
namespace {

// max |a - b| / max(max |b|, 1e-6).
double RelativeDifference(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor bd = b.to(at::kDouble);
  const double scale = std::max(bd.abs().max().item<double>(), 1e-6);
  return (a.to(at::kDouble) - bd).abs().max().item<double>() / scale;
}

// Leaves: float32 copies that require grad, and float64 copies of the same values.
struct Inputs {
  std::vector<at::Tensor> f32, f64;
};

Inputs LeavesOf(const std::vector<at::Tensor>& values) {
  Inputs in;
  for (const at::Tensor& v : values) {
    in.f32.push_back(v.to(at::kFloat).detach().requires_grad_(true));
    in.f64.push_back(v.to(at::kDouble).detach().requires_grad_(true));
  }
  return in;
}

void ExpectGradientsAgree(const at::Tensor& out32, const at::Tensor& out64, const Inputs& in,
                          double tolerance) {
  ASSERT_EQ(out32.scalar_type(), at::kFloat);
  ASSERT_EQ(out64.scalar_type(), at::kDouble);
  ASSERT_EQ(out32.sizes(), out64.sizes());
  EXPECT_LE(RelativeDifference(out32, out64), tolerance);
  const at::Tensor upstream = at::randn(out64.sizes(), at::kDouble);
  torch::autograd::backward({out32}, {upstream.to(at::kFloat)});
  torch::autograd::backward({out64}, {upstream});
  for (size_t i = 0; i < in.f32.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "input " << i);
    ASSERT_EQ(in.f32[i].grad().defined(), in.f64[i].grad().defined());
    if (!in.f64[i].grad().defined()) continue;
    EXPECT_LE(RelativeDifference(in.f32[i].grad(), in.f64[i].grad()), tolerance);
  }
}

class DenseKernels : public ::testing::TestWithParam<GemmLibrary> {
 protected:
  void SetUp() override {
    if (!GemmLibraryAvailable(GetParam())) {
      GTEST_SKIP() << GemmLibraryName(GetParam()) << " is not in this process";
    }
    before_ = UsedGemmLibrary();
    UseGemmLibrary(GetParam());
    ASSERT_EQ(UsedGemmLibrary(), GetParam());
    at::manual_seed(7);
  }
  void TearDown() override { UseGemmLibrary(before_); }

 private:
  GemmLibrary before_ = GemmLibrary::kLibTorch;
};

TEST_P(DenseKernels, LinearWithBiasMatchesFloat64) {
  Inputs in = LeavesOf({at::randn({4, 9, 24}), at::randn({40, 24}), at::randn({40})});
  ExpectGradientsAgree(Linear(in.f32[0], in.f32[1], in.f32[2]),
                       Linear(in.f64[0], in.f64[1], in.f64[2]), in, 1e-5);
}

TEST_P(DenseKernels, LinearWithoutBiasOfANonContiguousInputMatchesFloat64) {
  Inputs in = LeavesOf({at::randn({20, 40}), at::randn({17, 33})});
  const at::Tensor x32 = in.f32[0].narrow(1, 2, 33);  // columns 2..34: rows are not dense
  const at::Tensor x64 = in.f64[0].narrow(1, 2, 33);
  ASSERT_FALSE(x32.is_contiguous());
  ExpectGradientsAgree(Linear(x32, in.f32[1], at::Tensor()), Linear(x64, in.f64[1], at::Tensor()),
                       in, 1e-5);
}

TEST_P(DenseKernels, LinearComputesOnlyTheGradientsAskedFor) {
  at::Tensor x = at::randn({5, 8});
  at::Tensor w = at::randn({3, 8}).requires_grad_(true);
  at::Tensor b = at::randn({3});
  Linear(x, w, b).sum().backward();
  EXPECT_TRUE(w.grad().defined());
  EXPECT_FALSE(x.grad().defined());
  EXPECT_FALSE(b.grad().defined());
}

TEST_P(DenseKernels, ShapeErrorsAreLibTorchsErrors) {
  EXPECT_THROW(Linear(at::randn({2, 3}), at::randn({4, 5}), at::Tensor()), std::exception);
  EXPECT_THROW(Linear(at::randn({2, 5}), at::randn({4, 5}), at::randn({3})), std::exception);
  EXPECT_THROW(CausalSelfAttention(at::randn({2, 3, 24}), 5), std::exception);
}

TEST_P(DenseKernels, LinearGeluMatchesFloat64) {
  // Pre-activations spread over [-12, 12]: both tails of erf and the clamp at 4.
  Inputs in = LeavesOf({at::randn({3, 50, 16}) * 3, at::randn({64, 16}), at::randn({64})});
  ExpectGradientsAgree(LinearGelu(in.f32[0], in.f32[1], in.f32[2]),
                       LinearGelu(in.f64[0], in.f64[1], in.f64[2]), in, 1e-5);
}

TEST_P(DenseKernels, GeluIsAccurateElementwise) {
  // Through an identity weight and zero bias, LinearGelu is GELU itself: compare each
  // element and its derivative with the float64 values, absolutely.
  const at::Tensor x = at::linspace(-10, 10, 20001, at::kDouble).reshape({-1, 1});
  const at::Tensor x32 = x.to(at::kFloat).requires_grad_(true);
  const at::Tensor x64 = x32.detach().to(at::kDouble).requires_grad_(true);
  const at::Tensor y32 = LinearGelu(x32, at::ones({1, 1}), at::zeros({1}));
  const at::Tensor y64 = at::gelu(x64);
  y32.sum().backward();
  y64.sum().backward();
  EXPECT_LE((y32.to(at::kDouble) - y64).abs().max().item<double>(), 2e-6);
  EXPECT_LE((x32.grad().to(at::kDouble) - x64.grad()).abs().max().item<double>(), 2e-6);
}

TEST_P(DenseKernels, CausalSelfAttentionMatchesFloat64) {
  struct Shape {
    int64_t b, t, d, heads;
  };
  for (const auto& [b, t, d, heads] :
       {Shape{2, 16, 32, 4}, Shape{3, 7, 12, 3}, Shape{1, 1, 8, 2}}) {
    SCOPED_TRACE(::testing::Message()
                 << "b " << b << " t " << t << " d " << d << " heads " << heads);
    Inputs in = LeavesOf({at::randn({b, t, 3 * d})});
    ExpectGradientsAgree(CausalSelfAttention(in.f32[0], heads),
                         CausalSelfAttention(in.f64[0], heads), in, 1e-5);
  }
}

TEST_P(DenseKernels, CausalSelfAttentionIsCausal) {
  at::Tensor qkv = at::randn({2, 10, 3 * 16});
  const at::Tensor y = CausalSelfAttention(qkv, 4);
  // Changing the last position changes only the last output position.
  at::Tensor changed = qkv.clone();
  changed.select(1, 9).normal_();
  const at::Tensor y2 = CausalSelfAttention(changed, 4);
  EXPECT_TRUE(at::equal(y.narrow(1, 0, 9), y2.narrow(1, 0, 9)));
  EXPECT_FALSE(at::equal(y.select(1, 9), y2.select(1, 9)));
}

TEST_P(DenseKernels, AttentionWithAProbabilityMapTakesTheComposedPath) {
  Inputs in = LeavesOf({at::randn({2, 6, 24})});
  auto halve = [](const at::Tensor& p) { return p * 0.5; };
  ExpectGradientsAgree(CausalSelfAttention(in.f32[0], 2, halve),
                       CausalSelfAttention(in.f64[0], 2) * 0.5, in, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Libraries, DenseKernels,
                         ::testing::Values(GemmLibrary::kOneDnn, GemmLibrary::kOpenBlas,
                                           GemmLibrary::kLibTorch),
                         [](const ::testing::TestParamInfo<GemmLibrary>& info) {
                           return std::string(GemmLibraryName(info.param));
                         });

TEST(GemmLibraries, BothAreInALibTorchProcessOnDebian) {
  // LibTorch on Debian links oneDNN and OpenBLAS: if either goes missing, half the tests
  // above skip, which must not pass unnoticed.
  EXPECT_TRUE(GemmLibraryAvailable(GemmLibrary::kOneDnn));
  EXPECT_TRUE(GemmLibraryAvailable(GemmLibrary::kOpenBlas));
  EXPECT_NE(UsedGemmLibrary(), GemmLibrary::kLibTorch);
}

}  // namespace
}  // namespace pipetrain::model
