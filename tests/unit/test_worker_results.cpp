// The worker's results are bit for bit those of the in-process kernel: several steps over groups
// of every gradient and copy-out type, per-group hyperparameters that change between steps, a
// gradient scale and alternating gradient buffers. The worker splits every group between two pinned
// threads; the reference runs each group alone on one thread. The last steps go in buckets
// (zb_worker_submit_groups), out of order, and still equal the reference to the bit.
#include <zbadam/adam.hpp>
#include <zbadam/adam_convert.hpp>

#include <zenbind/worker.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

extern "C" { // Debian's cmocka.h has no C++ guard
#include <cmocka.h>
}

namespace {

struct Case {
    zb_dtype grad, copy;
    int stale;
    size_t n;
};

size_t dsize(zb_dtype d) {
    return d == ZB_DTYPE_FP32 ? 4 : d == ZB_DTYPE_NONE ? 0 : 2;
}

void fill_grad(void *dst, zb_dtype type, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; ++i) {
        seed = seed * 1664525u + 1013904223u;
        float g = (float(seed >> 8) / float(1u << 24) - 0.5f) * 4.0f;
        if (i % 997 == 5) g = 0.0f;
        uint32_t u;
        std::memcpy(&u, &g, 4);
        if (type == ZB_DTYPE_FP32)
            static_cast<float *>(dst)[i] = g;
        else if (type == ZB_DTYPE_BF16)
            static_cast<uint16_t *>(dst)[i] = static_cast<uint16_t>(u >> 16);
        else
            static_cast<uint16_t *>(dst)[i] = zb::opt::detail::float_to_f16(g);
    }
}

zb::opt::GradType grad_type(zb_dtype d) {
    return d == ZB_DTYPE_FP32   ? zb::opt::GradType::f32
           : d == ZB_DTYPE_BF16 ? zb::opt::GradType::bf16
                                : zb::opt::GradType::f16;
}

zb::opt::CopyType copy_type(zb_dtype d) {
    return d == ZB_DTYPE_NONE   ? zb::opt::CopyType::none
           : d == ZB_DTYPE_BF16 ? zb::opt::CopyType::bf16
                                : zb::opt::CopyType::f16;
}

struct Reference {
    std::vector<float> param, m, v, stale;
    std::vector<char> grads[2], copy;
};

void test_bit_identical(void **) {
    const Case cases[] = {{ZB_DTYPE_FP32, ZB_DTYPE_BF16, 1, 10007},
                          {ZB_DTYPE_BF16, ZB_DTYPE_FP16, 0, 4099},
                          {ZB_DTYPE_FP16, ZB_DTYPE_NONE, 1, 3001},
                          {ZB_DTYPE_FP32, ZB_DTYPE_NONE, 0, 17}};
    const size_t ng = sizeof cases / sizeof cases[0];
    zb_worker_attr attr;
    zb_worker_attr_init(&attr);
    attr.threads = 2;
    zb_worker_t *w = nullptr;
    assert_int_equal(zb_worker_spawn(&attr, 0, &w), ZB_OK);

    std::vector<zb_adam_hyper> hypers(ng);
    std::vector<zb_group_buffers> bufs(ng);
    std::vector<Reference> ref(ng);
    for (size_t g = 0; g < ng; ++g) {
        zb_adam_hyper_init(&hypers[g]);
        hypers[g].lr = 1e-2f * float(g + 1);
        hypers[g].weight_decay = g == 1 ? 0.0f : 0.05f;
        hypers[g].adamw = g != 2; // one group with L2 (Adam) weight decay
        zb_group_attr ga{};
        ga.numel = cases[g].n;
        ga.grad = cases[g].grad;
        ga.copy_out = cases[g].copy;
        ga.stale = cases[g].stale;
        ga.hyper = hypers[g];
        unsigned id;
        assert_int_equal(zb_worker_group_add(w, &ga, &id), ZB_OK);
        assert_int_equal(id, g);
        assert_int_equal(zb_worker_group_buffers(w, id, &bufs[g]), ZB_OK);
        const size_t n = cases[g].n;
        Reference &r = ref[g];
        r.param.resize(n);
        r.m.assign(n, 0.0f);
        r.v.assign(n, 0.0f);
        r.stale.resize(n);
        r.copy.resize(n * dsize(cases[g].copy));
        for (size_t i = 0; i < n; ++i)
            r.param[i] = bufs[g].params[i] = float(i % 13) * 0.1f - 0.6f;
        for (int k = 0; k < 2; ++k)
            r.grads[k].resize(n * dsize(cases[g].grad));
    }

    for (int64_t step = 1; step <= 6; ++step) {
        const unsigned k = unsigned(step & 1);
        const float scale = step == 4 ? 0.5f : 1.0f;
        if (step == 3)
            for (auto &h : hypers)
                h.lr *= 0.5f, h.beta1 = 0.8f;
        for (size_t g = 0; g < ng; ++g) {
            const size_t n = cases[g].n;
            fill_grad(bufs[g].grads[k], cases[g].grad, n, uint32_t(step * 31 + g));
            std::memcpy(ref[g].grads[k].data(), bufs[g].grads[k], n * dsize(cases[g].grad));
        }
        if (step < 5) {
            const zb_worker_step s{step, scale, k, hypers.data(), ng, 0, 0.0f};
            assert_int_equal(zb_worker_submit(w, &s), ZB_OK);
        } else {
            // Step 5: two buckets, the second first; step 6: one group at a time, in the order
            // backward would produce them, each numbering itself (step 0: its count + 1).
            using Buckets = std::vector<std::array<unsigned, 2>>; // first group, count
            const Buckets buckets =
                step == 5 ? Buckets{{2, 2}, {0, 2}} : Buckets{{3, 1}, {2, 1}, {1, 1}, {0, 1}};
            for (const auto &[first, count] : buckets) {
                const zb_worker_step s{
                    step == 5 ? step : 0, scale, k, hypers.data() + first, count, 0, 0.0f};
                assert_int_equal(zb_worker_submit_groups(w, &s, first, count), ZB_OK);
                assert_int_equal(zb_worker_wait_result(w, 30000, nullptr), ZB_OK);
            }
        }
        for (size_t g = 0; g < ng; ++g) {
            Reference &r = ref[g];
            zb::opt::AdamHyper h;
            h.lr = hypers[g].lr;
            h.beta1 = hypers[g].beta1;
            h.beta2 = hypers[g].beta2;
            h.eps = hypers[g].eps;
            h.weight_decay = hypers[g].weight_decay;
            h.adamw = hypers[g].adamw != 0;
            h.bias_correction = hypers[g].bias_correction != 0;
            h.step = step;
            h.grad_scale = scale;
            zb::opt::AdamTensor t;
            t.param = r.param.data();
            t.grad = r.grads[k].data();
            t.exp_avg = r.m.data();
            t.exp_avg_sq = r.v.data();
            t.copy_out = cases[g].copy == ZB_DTYPE_NONE ? nullptr : r.copy.data();
            t.stale = cases[g].stale ? r.stale.data() : nullptr;
            t.n = cases[g].n;
            t.hyper = &h;
            const zb::opt::AdamBatch b{grad_type(cases[g].grad), copy_type(cases[g].copy), &t, 1};
            zb::opt::adam_step(b, 1);
        }
        if (step < 5) assert_int_equal(zb_worker_wait_result(w, 30000, nullptr), ZB_OK);
        for (size_t g = 0; g < ng; ++g) {
            const size_t n = cases[g].n;
            assert_memory_equal(bufs[g].params, ref[g].param.data(), 4 * n);
            if (cases[g].stale) assert_memory_equal(bufs[g].stale, ref[g].stale.data(), 4 * n);
            if (cases[g].copy != ZB_DTYPE_NONE)
                assert_memory_equal(bufs[g].copy_out, ref[g].copy.data(), 2 * n);
        }
    }
    assert_int_equal(zb_worker_destroy(w), ZB_OK);
}

// A range of groups past those registered, an empty one, or hypers of another length: refused,
// and the worker still steps afterwards.
void test_bad_group_ranges(void **) {
    zb_worker_attr attr;
    zb_worker_attr_init(&attr);
    attr.threads = 1;
    zb_worker_t *w = nullptr;
    assert_int_equal(zb_worker_spawn(&attr, 0, &w), ZB_OK);
    zb_group_attr ga{};
    ga.numel = 64;
    ga.grad = ZB_DTYPE_FP32;
    zb_adam_hyper_init(&ga.hyper);
    unsigned id;
    for (int g = 0; g < 2; ++g)
        assert_int_equal(zb_worker_group_add(w, &ga, &id), ZB_OK);
    zb_adam_hyper two[2] = {ga.hyper, ga.hyper};
    const zb_worker_step plain{0, 1.0f, 0, nullptr, 0, 0, 0.0f};
    assert_int_equal(zb_worker_submit_groups(w, &plain, 1, 2), ZB_EINVAL);
    assert_non_null(std::strstr(zb_last_error(), "not registered"));
    assert_int_equal(zb_worker_submit_groups(w, &plain, 2, 1), ZB_EINVAL);
    assert_int_equal(zb_worker_submit_groups(w, &plain, 0, 0), ZB_EINVAL);
    const zb_worker_step wrong{0, 1.0f, 0, two, 2, 0, 0.0f};
    assert_int_equal(zb_worker_submit_groups(w, &wrong, 1, 1), ZB_EINVAL);
    assert_non_null(std::strstr(zb_last_error(), "nhypers"));
    const zb_worker_step right{0, 1.0f, 0, two, 1, 0, 0.0f};
    assert_int_equal(zb_worker_submit_groups(w, &right, 1, 1), ZB_OK);
    assert_int_equal(zb_worker_wait_result(w, 30000, nullptr), ZB_OK);
    float m[64], v[64];
    int64_t count = -1;
    assert_int_equal(zb_worker_group_get_state(w, 0, m, v, &count), ZB_OK);
    assert_int_equal(count, 0); // untouched by the other group's step
    assert_int_equal(zb_worker_group_get_state(w, 1, m, v, &count), ZB_OK);
    assert_int_equal(count, 1);
    assert_int_equal(zb_worker_destroy(w), ZB_OK);
}

} // namespace

int main() {
    const CMUnitTest tests[] = {cmocka_unit_test(test_bit_identical),
                                cmocka_unit_test(test_bad_group_ranges)};
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
