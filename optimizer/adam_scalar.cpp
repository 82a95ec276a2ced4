// The portable path and the reference the vector paths must match bit for bit.
#include "adam_kernels.hpp"
#include <zbadam/adam_convert.hpp>

#include <cmath>

namespace zb::opt::detail {
namespace {

template <GradType G> float load_grad(const void *grad, size_t i) {
    if constexpr (G == GradType::f32)
        return static_cast<const float *>(grad)[i];
    else if constexpr (G == GradType::bf16)
        return bf16_to_float(static_cast<const uint16_t *>(grad)[i]);
    else
        return f16_to_float(static_cast<const uint16_t *>(grad)[i]);
}

template <GradType G, CopyType C>
uint64_t run(const AdamTensor &t, const Consts &c, size_t lo, size_t hi) {
    uint64_t bad = 0;
    for (size_t i = lo; i < hi; ++i) {
        float g = load_grad<G>(t.grad, i) * c.grad_scale;
        bad += !(std::fabs(g) < INFINITY);
        float p = t.param[i];
        if (c.adamw)
            p = p * c.decay;
        else
            g = std::fma(c.l2, p, g);
        const float m = std::fma(c.one_minus_beta1, g, c.beta1 * t.exp_avg[i]);
        const float v = std::fma(c.one_minus_beta2 * g, g, c.beta2 * t.exp_avg_sq[i]);
        const float d = std::fma(std::sqrt(v), c.inv_bias2_sqrt, c.eps);
        p = std::fma(c.neg_step_size, m / d, p);
        t.param[i] = p;
        t.exp_avg[i] = m;
        t.exp_avg_sq[i] = v;
        if constexpr (C == CopyType::bf16)
            static_cast<uint16_t *>(t.copy_out)[i] = float_to_bf16(p);
        else if constexpr (C == CopyType::f16)
            static_cast<uint16_t *>(t.copy_out)[i] = float_to_f16(p);
        if (t.stale) t.stale[i] = p;
    }
    return bad;
}

} // namespace

uint64_t range_scalar(const AdamTensor &t, const Consts &c, GradType g, CopyType cp, size_t lo,
                      size_t hi) {
    return dispatch_types(g, cp, [&]<GradType G, CopyType C>() { return run<G, C>(t, c, lo, hi); });
}

} // namespace zb::opt::detail
