// Lab 04: the CPU kernel of "labs_ext::silu_mul": out = silu(gate) * up, silu(g) = g / (1 + exp(-g)).
// helpers.ext.lab.lab_source(body) puts your loop body where the LAB line is; everything else is given.
// The schema is defined from Python (helpers/ext/lab.py); this file registers only the CPU kernel.
#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <cmath>

namespace labs_lab {

// Called by at::parallel_for on one chunk [begin, end) of the flattened tensors.
template <typename scalar_t>
void silu_mul_chunk(const scalar_t* gate, const scalar_t* up, scalar_t* out, int64_t begin, int64_t end) {
  using acc_t = at::opmath_type<scalar_t>;   // compute in acc_t: float for bf16/fp16
  // LAB: the loop body goes here
}

at::Tensor silu_mul_cpu(const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK(gate.sizes() == up.sizes(), "silu_mul: gate ", gate.sizes(), " and up ", up.sizes(),
              " must have the same shape");
  TORCH_CHECK(gate.scalar_type() == up.scalar_type(), "silu_mul: gate is ", gate.scalar_type(),
              " but up is ", up.scalar_type(), "; use one dtype");
  const at::Tensor g = gate.contiguous();
  const at::Tensor u = up.contiguous();
  at::Tensor out = at::empty_like(g);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, g.scalar_type(), "silu_mul_cpu", [&] {
    const scalar_t* gp = g.const_data_ptr<scalar_t>();
    const scalar_t* up_ = u.const_data_ptr<scalar_t>();
    scalar_t* op = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, g.numel(), 4096, [&](int64_t begin, int64_t end) {
      silu_mul_chunk<scalar_t>(gp, up_, op, begin, end);
    });
  });
  return out;
}

TORCH_LIBRARY_IMPL(labs_ext, CPU, m) {
  m.impl("silu_mul", &silu_mul_cpu);
}

}  // namespace labs_lab
