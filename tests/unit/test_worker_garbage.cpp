// libzenbind against a worker that answers garbage or scribbles on the control block: the library
// keeps its own record of what it registered, and reports a worker's nonsense as ZB_EINTERNAL,
// never as success or as a status the C API does not define. The fake workers are this program,
// started by zb_worker_spawn with ZB_FAKE_WORKER naming what to do.
#include <zbproto/futex.hpp>
#include <zbproto/layout.hpp>
#include <zenbind/worker.h>

#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <setjmp.h>
#include <string>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

extern "C" {
#include <cmocka.h>
}

namespace proto = zb::proto;

namespace {

// The fake worker: "ready_failed_ok" says it failed to start, with status ZB_OK; "bad_status"
// starts, then answers every request with status 12345.
int fake_worker(const std::string &mode) {
    alarm(30);
    struct stat st {};
    if (fstat(proto::kControlFd, &st) != 0) return 1;
    void *base = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED,
                      proto::kControlFd, 0);
    if (base == MAP_FAILED) return 1;
    static_cast<proto::Header *>(base)->worker_version = proto::kVersion;
    proto::Control &ctl = *proto::control_of(base);
    if (mode == "ready_failed_ok") {
        ctl.status = ZB_OK;
        std::strcpy(ctl.message, "all is well");
        proto::publish(ctl.ready, ctl.trainer_sleeping, uint32_t(proto::Ready::failed));
        pause();
        return 1;
    }
    proto::publish(ctl.ready, ctl.trainer_sleeping, uint32_t(proto::Ready::ready));
    for (uint32_t seen = 0;;) {
        const uint32_t v =
            proto::sleep_for_change(ctl.req_seq, ctl.worker_sleeping, seen, 100'000'000);
        if (v == seen) continue;
        seen = v;
        if (ctl.command == proto::Command::exit) return 0;
        ctl.status = 12345;
        std::memset(ctl.message, 'x', sizeof ctl.message); // and no terminating NUL
        proto::publish(ctl.done_seq, ctl.trainer_sleeping, v);
    }
}

std::string self() {
    char path[4096];
    const ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
    assert_true(n > 0);
    return std::string(path, static_cast<size_t>(n));
}

zb_worker_attr fake_attr(const std::string &path) {
    zb_worker_attr attr;
    zb_worker_attr_init(&attr);
    attr.threads = 1;
    attr.path = path.c_str();
    attr.control_timeout_ms = 10000;
    return attr;
}

// A worker that says it failed with status ZB_OK: the spawn fails, with no handle.
void failed_start_with_ok_status(void **) {
    const std::string path = self();
    setenv("ZB_FAKE_WORKER", "ready_failed_ok", 1);
    const zb_worker_attr attr = fake_attr(path);
    zb_worker_t *w = reinterpret_cast<zb_worker_t *>(1);
    const zb_status st = zb_worker_spawn(&attr, 0, &w);
    unsetenv("ZB_FAKE_WORKER");
    assert_int_equal(st, ZB_EINTERNAL);
    assert_null(w);
    assert_non_null(std::strstr(zb_last_error(), "all is well"));
}

// The attributes of an fp32 group of n elements without copy-out.
zb_group_attr fp32_group(uint64_t n) {
    zb_group_attr g;
    std::memset(&g, 0, sizeof g);
    g.numel = n;
    g.grad = ZB_DTYPE_FP32;
    g.copy_out = ZB_DTYPE_NONE;
    zb_adam_hyper_init(&g.hyper);
    return g;
}

// A worker answering a status that no zb_status is: ZB_EINTERNAL, its message bounded.
void undefined_status(void **) {
    const std::string path = self();
    setenv("ZB_FAKE_WORKER", "bad_status", 1);
    const zb_worker_attr attr = fake_attr(path);
    zb_worker_t *w = nullptr;
    const zb_status spawned = zb_worker_spawn(&attr, 0, &w);
    unsetenv("ZB_FAKE_WORKER");
    assert_int_equal(spawned, ZB_OK);
    const zb_group_attr g = fp32_group(1000);
    unsigned group = 0;
    assert_int_equal(zb_worker_group_add(w, &g, &group), ZB_EINTERNAL);
    const std::string message = zb_last_error();
    assert_true(message.size() < proto::kMessageSize + 64);
    assert_int_equal(zb_worker_destroy(w), ZB_OK);
}

// A real worker whose control block is then scribbled on (as a buggy worker could): the group's
// buffers, its state and the thread table are still the ones the library registered.
void scribbled_control_block(void **) {
    zb_worker_attr attr;
    zb_worker_attr_init(&attr);
    attr.threads = 1;
    zb_worker_t *w = nullptr;
    if (zb_worker_spawn(&attr, 0, &w) != ZB_OK) fail_msg("spawn: %s", zb_last_error());
    const zb_group_attr g = fp32_group(1000);
    unsigned group = 0;
    assert_int_equal(zb_worker_group_add(w, &g, &group), ZB_OK);
    zb_group_buffers before{}, after{};
    assert_int_equal(zb_worker_group_buffers(w, group, &before), ZB_OK);

    pid_t pid = 0;
    assert_int_equal(zb_worker_pid(w, &pid), ZB_OK);
    const std::string fd3 = "/proc/" + std::to_string(pid) + "/fd/3";
    const int fd = open(fd3.c_str(), O_RDWR);
    assert_true(fd >= 0);
    void *base = mmap(nullptr, proto::kControlSegment, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(base != MAP_FAILED);
    close(fd);
    proto::Control &ctl = *proto::control_of(base);
    ctl.groups[group].off_params = uint64_t(1) << 50;
    ctl.groups[group].numel = uint64_t(1) << 40;
    ctl.nthreads = 1u << 30;

    assert_int_equal(zb_worker_group_buffers(w, group, &after), ZB_OK);
    assert_ptr_equal(after.params, before.params);
    assert_int_equal(after.numel, 1000);
    unsigned threads = 0;
    assert_int_equal(zb_worker_threads(w, &threads), ZB_OK);
    assert_int_equal(threads, 1);
    pid_t tid = 0;
    int cpu = 0;
    assert_int_equal(zb_worker_thread(w, 100000, &tid, &cpu), ZB_EINVAL);
    // The state of 1000 elements into buffers of 1000, not of 2^40.
    std::vector<float> m(1000, -1.0f), v(1000, -1.0f);
    int64_t step = -1;
    assert_int_equal(zb_worker_group_get_state(w, group, m.data(), v.data(), &step), ZB_OK);
    assert_true(m[999] == 0.0f && v[0] == 0.0f);
    munmap(base, proto::kControlSegment);
    assert_int_equal(zb_worker_destroy(w), ZB_OK);
}

} // namespace

int main() {
    if (const char *mode = std::getenv("ZB_FAKE_WORKER")) return fake_worker(mode);
    const CMUnitTest tests[] = {
        cmocka_unit_test(failed_start_with_ok_status),
        cmocka_unit_test(undefined_status),
        cmocka_unit_test(scribbled_control_block),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
