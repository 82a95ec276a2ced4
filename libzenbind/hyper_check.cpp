#include "hyper_check.hpp"

#include <cmath>

namespace zb {

void check_hyper(const zb_adam_hyper &h, const std::string &where) {
    auto bad = [&](const char *what) { fail(ZB_EINVAL, where + ": " + what); };
    if (!std::isfinite(h.lr) || h.lr < 0) bad("lr must be finite and >= 0");
    if (!(h.beta1 >= 0 && h.beta1 < 1) || !(h.beta2 >= 0 && h.beta2 < 1))
        bad("beta1 and beta2 must be in [0, 1)");
    if (!std::isfinite(h.eps) || h.eps < 0) bad("eps must be finite and >= 0");
    if (!std::isfinite(h.weight_decay) || h.weight_decay < 0)
        bad("weight_decay must be finite and >= 0");
    if ((h.adamw != 0 && h.adamw != 1) || (h.bias_correction != 0 && h.bias_correction != 1))
        bad("adamw and bias_correction must be 0 or 1");
}

} // namespace zb
