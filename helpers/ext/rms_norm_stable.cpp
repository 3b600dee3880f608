// RMSNorm for CPU float32 against the LibTorch stable ABI: y = x / sqrt(mean(x^2 over the last dim) + eps) * w.
// Only torch/csrc/stable and torch/headeronly headers: the library talks to torch through its C shim,
// so one build loads in every torch from TORCH_TARGET_VERSION (2.10 here, set with -D) onwards.
// Unlike rms_norm_cpu.cpp it defines its own schema (STABLE_TORCH_LIBRARY): load the library first,
// then register the fake kernel and the autograd formula from Python.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/macros/Macros.h>

#include <cmath>

using torch::stable::Tensor;

Tensor rms_norm_stable(const Tensor& x, const Tensor& weight, double eps) {
  STD_TORCH_CHECK(x.scalar_type() == torch::headeronly::ScalarType::Float &&
                  weight.scalar_type() == torch::headeronly::ScalarType::Float,
                  "rms_norm (stable ABI): float32 only");
  STD_TORCH_CHECK(x.dim() >= 1 && weight.dim() == 1 && weight.size(0) == x.size(x.dim() - 1),
                  "rms_norm (stable ABI): weight must have shape (x.size(-1),)");
  const Tensor xc = torch::stable::contiguous(x);
  const Tensor wc = torch::stable::contiguous(weight);
  Tensor out = torch::stable::empty_like(xc);
  const int64_t n = xc.numel() == 0 ? 0 : xc.size(xc.dim() - 1);
  const int64_t rows = n == 0 ? 0 : xc.numel() / n;
  const float* xp = xc.const_data_ptr<float>();
  const float* wp = wc.const_data_ptr<float>();
  float* op = out.mutable_data_ptr<float>();
  torch::stable::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float sum_sq = 0.f;
      for (int64_t j = 0; j < n; ++j) sum_sq += xp[r * n + j] * xp[r * n + j];
      const float rstd = 1.f / std::sqrt(sum_sq / static_cast<float>(n) + static_cast<float>(eps));
      for (int64_t j = 0; j < n; ++j) op[r * n + j] = xp[r * n + j] * rstd * wp[j];
    }
  });
  return out;
}

STABLE_TORCH_LIBRARY(labs_stable, m) {     // the schema, in C++: one such block per namespace
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(labs_stable, CPU, m) {
  m.impl("rms_norm", TORCH_BOX(&rms_norm_stable));
}
