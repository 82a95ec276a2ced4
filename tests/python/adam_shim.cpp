// Test-only C entry point over zb::opt::adam_step for test_adam_torch.py (ctypes cannot call C++).
#include "adam.hpp"

extern "C" uint64_t zf_test_adam_step(float *param, const void *grad, float *exp_avg,
                                      float *exp_avg_sq, void *copy_out, size_t n, int grad_type,
                                      int copy_type, float lr, float beta1, float beta2, float eps,
                                      float weight_decay, int adamw, int bias_correction,
                                      int64_t step, float grad_scale, int threads) {
    zb::opt::AdamHyper h;
    h.lr = lr;
    h.beta1 = beta1;
    h.beta2 = beta2;
    h.eps = eps;
    h.weight_decay = weight_decay;
    h.adamw = adamw != 0;
    h.bias_correction = bias_correction != 0;
    h.step = step;
    h.grad_scale = grad_scale;
    const zb::opt::AdamTensor t{param, grad, exp_avg, exp_avg_sq, copy_out, nullptr, n, &h};
    const zb::opt::AdamBatch b{static_cast<zb::opt::GradType>(grad_type),
                               static_cast<zb::opt::CopyType>(copy_type), &t, 1};
    return zb::opt::adam_step(b, threads);
}
