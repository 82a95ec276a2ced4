#include "hyper_check.hpp"

#include <cmath>
#include <cstdio>

namespace zb {

void check_hyper(const zb_adam_hyper &h, const std::string &where) {
    // the rule and the values it saw (two for a pair)
    auto bad = [&](const char *rule, double a, double b, bool pair) {
        char got[96];
        if (pair)
            std::snprintf(got, sizeof got, " (got %g, %g)", a, b);
        else
            std::snprintf(got, sizeof got, " (got %g)", a);
        fail(ZB_EINVAL, where + ": " + rule + got);
    };
    if (!std::isfinite(h.lr) || h.lr < 0) bad("lr must be finite and >= 0", h.lr, 0, false);
    if (!(h.beta1 >= 0 && h.beta1 < 1) || !(h.beta2 >= 0 && h.beta2 < 1))
        bad("beta1 and beta2 must be in [0, 1)", h.beta1, h.beta2, true);
    if (!std::isfinite(h.eps) || h.eps < 0) bad("eps must be finite and >= 0", h.eps, 0, false);
    if (!std::isfinite(h.weight_decay) || h.weight_decay < 0)
        bad("weight_decay must be finite and >= 0", h.weight_decay, 0, false);
    if ((h.adamw != 0 && h.adamw != 1) || (h.bias_correction != 0 && h.bias_correction != 1))
        bad("adamw and bias_correction must be 0 or 1", h.adamw, h.bias_correction, true);
}

} // namespace zb

extern "C" zb_status zb_adam_hyper_check(const zb_adam_hyper *hyper) {
    return zb::guard([&] {
        if (!hyper) zb::fail(ZB_EINVAL, "zb_adam_hyper_check: hyper is NULL");
        zb::check_hyper(*hyper, "zb_adam_hyper_check");
    });
}
