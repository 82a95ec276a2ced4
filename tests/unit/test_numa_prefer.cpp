// prefer_nodes against a model of the kernel's mbind(2): this program defines mbind, so the
// protocol library calls the model, not libnuma's. The model keeps what the kernel does: it reads
// maxnode - 1 bits of the mask (mm/mempolicy.c, get_nodes), drops the nodes that have no memory or
// that the cgroup's cpuset.mems forbids, and refuses a policy left with no node; a kernel older
// than 5.15 refuses MPOL_PREFERRED_MANY.
#include <zbproto/numa.hpp>

#include <cerrno>
#include <cstdint>
#include <numaif.h>
#include <set>
#include <vector>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

extern "C" { // Debian's cmocka.h has no C++ guard
#include <cmocka.h>
}

namespace {

constexpr unsigned long kWord = 8 * sizeof(unsigned long);

struct Kernel {
    bool preferred_many = true; // Linux >= 5.15
    std::set<int> usable;       // nodes with memory that cpuset.mems allows
    int calls = 0;
    int mode = -1; // the policy that took, and its nodes
    std::set<int> nodes;
} kernel;

void reset(bool preferred_many, std::set<int> usable) {
    kernel = Kernel{};
    kernel.preferred_many = preferred_many;
    kernel.usable = std::move(usable);
}

} // namespace

extern "C" long mbind(void *, unsigned long, int mode, const unsigned long *nmask,
                      unsigned long maxnode, unsigned) {
    ++kernel.calls;
    if (mode == MPOL_PREFERRED_MANY && !kernel.preferred_many) {
        errno = EINVAL;
        return -1;
    }
    std::set<int> asked, left;
    for (unsigned long n = 0; n + 1 < maxnode; ++n) // maxnode - 1 bits
        if (nmask[n / kWord] >> (n % kWord) & 1) asked.insert(static_cast<int>(n));
    for (int n : asked)
        if (kernel.usable.count(n)) left.insert(n);
    if (asked.empty() && mode == MPOL_PREFERRED) { // an empty preferred mask: local allocation
        kernel.mode = MPOL_LOCAL;
        kernel.nodes.clear();
        return 0;
    }
    if (left.empty()) {
        errno = EINVAL;
        return -1;
    }
    kernel.mode = mode;
    kernel.nodes = mode == MPOL_PREFERRED ? std::set<int>{*left.begin()} : left;
    return 0;
}

namespace {

bool prefer(std::vector<int32_t> nodes) {
    static char page[4096];
    return zb::proto::prefer_nodes(page, sizeof page, nodes.data(), nodes.size());
}

void test_several_nodes_prefer_many(void **) {
    reset(true, {0, 1});
    assert_true(prefer({0, 1}));
    assert_int_equal(kernel.mode, MPOL_PREFERRED_MANY);
    assert_true((kernel.nodes == std::set<int>{0, 1}));
}

// A kernel before 5.15 takes one preferred node: the first listed that it can place pages on,
// not the first listed whatever it is (a memory-less node, or one outside cpuset.mems).
void test_old_kernel_takes_first_usable_node(void **) {
    reset(false, {1, 3});
    assert_true(prefer({0, 2, 3, 1}));
    assert_int_equal(kernel.mode, MPOL_PREFERRED);
    assert_true((kernel.nodes == std::set<int>{3}));

    reset(false, {0});
    assert_true(prefer({0, 1}));
    assert_true((kernel.nodes == std::set<int>{0}));

    reset(false, {7});
    assert_false(prefer({0, 1})); // none usable: the default policy stays
    assert_int_equal(kernel.mode, -1);
}

// Node 1023, the last of the 1024-bit mask, reaches the kernel (which reads maxnode - 1 bits):
// it is preferred, not turned into local allocation.
void test_highest_node_reaches_the_kernel(void **) {
    reset(true, {1023});
    assert_true(prefer({1023}));
    assert_int_equal(kernel.mode, MPOL_PREFERRED);
    assert_true((kernel.nodes == std::set<int>{1023}));

    reset(true, {5, 1023});
    assert_true(prefer({1023, 5}));
    assert_int_equal(kernel.mode, MPOL_PREFERRED_MANY);
    assert_true((kernel.nodes == std::set<int>{5, 1023}));
}

void test_no_valid_node_no_call(void **) {
    reset(true, {0});
    assert_false(prefer({}));
    assert_false(prefer({-1, 1024, INT32_MIN}));
    assert_int_equal(kernel.calls, 0);
}

} // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_several_nodes_prefer_many),
        cmocka_unit_test(test_old_kernel_takes_first_usable_node),
        cmocka_unit_test(test_highest_node_reaches_the_kernel),
        cmocka_unit_test(test_no_valid_node_no_call),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
