// Fused RMSNorm for CPU: y = x / sqrt(mean(x^2 over the last dim) + eps) * weight.
// One pass reads a row to get its mean square, a second writes the scaled row; rows run in
// parallel with at::parallel_for (ATen's intra-op thread pool, sized by torch.set_num_threads).
// Registers only a CPU kernel: the schema "labs_ext::rms_norm" is defined from Python
// (helpers/ext/__init__.py), together with the fake kernel and the autograd formula.
#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <cmath>

namespace labs_ext {

at::Tensor rms_norm_cpu(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(), "rms_norm_cpu: tensors must be on the CPU");
  TORCH_CHECK(weight.dim() == 1 && x.dim() >= 1 && weight.size(0) == x.size(-1),
              "rms_norm: weight must have shape (", x.dim() ? x.size(-1) : 0, ",), got ", weight.sizes());
  TORCH_CHECK(x.scalar_type() == weight.scalar_type(), "rms_norm: x is ", x.scalar_type(),
              " but weight is ", weight.scalar_type(), "; use one dtype");
  const at::Tensor xc = x.contiguous();
  const at::Tensor wc = weight.contiguous();
  at::Tensor out = at::empty_like(xc);
  const int64_t n = xc.numel() == 0 ? 0 : xc.size(-1);
  const int64_t rows = n == 0 ? 0 : xc.numel() / n;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, xc.scalar_type(), "rms_norm_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;   // float for bf16/fp16, else the type itself
    const scalar_t* xp = xc.const_data_ptr<scalar_t>();
    const scalar_t* wp = wc.const_data_ptr<scalar_t>();
    scalar_t* op = out.mutable_data_ptr<scalar_t>();
    // grain size: about 32k elements of work per task, so small inputs stay on one thread
    const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(n, 1));
    at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t* row = xp + r * n;
        // 8 independent partial sums: one running sum would make every add wait for the previous one,
        // and the compiler may turn the 8 lanes into SIMD instructions
        acc_t partial[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int64_t j = 0;
        for (; j + 8 <= n; j += 8) {
          for (int k = 0; k < 8; ++k) {
            const acc_t v = static_cast<acc_t>(row[j + k]);
            partial[k] += v * v;
          }
        }
        acc_t sum_sq = 0;
        for (; j < n; ++j) {
          const acc_t v = static_cast<acc_t>(row[j]);
          sum_sq += v * v;
        }
        for (int k = 0; k < 8; ++k) {
          sum_sq += partial[k];
        }
        const acc_t rstd = acc_t(1) / std::sqrt(sum_sq / static_cast<acc_t>(n) + static_cast<acc_t>(eps));
        scalar_t* dst = op + r * n;
        for (int64_t j = 0; j < n; ++j) {
          dst[j] = static_cast<scalar_t>(static_cast<acc_t>(row[j]) * rstd * static_cast<acc_t>(wp[j]));
        }
      }
    });
  });
  return out;
}

TORCH_LIBRARY_IMPL(labs_ext, CPU, m) {
  m.impl("rms_norm", &rms_norm_cpu);
}

}  // namespace labs_ext
