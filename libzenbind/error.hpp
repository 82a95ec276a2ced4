// Errors as values across the C ABI: C++ code throws zb::Error inside the library, and every
// exported function runs its body through zb::guard(), which turns any exception into a
// zb_status plus a thread-local message. Nothing escapes into C callers or slurmstepd.
#pragma once

#include <zenbind/zenbind.h>

#include <new>
#include <stdexcept>
#include <string>

namespace zb {

class Error : public std::runtime_error {
  public:
    Error(zb_status status, const std::string &message)
        : std::runtime_error(message), status_(status) {}
    zb_status status() const noexcept { return status_; }

  private:
    zb_status status_;
};

[[noreturn]] inline void fail(zb_status status, const std::string &message) {
    throw Error(status, message);
}

// "what: strerror(errno)" for a failed system call; call right after it.
[[noreturn]] void fail_errno(const std::string &what);

void set_last_error(const char *message) noexcept;

// The checks of what lets the ABI grow (zenbind.h, "How the ABI grows"). A size-prefixed
// configuration is refused when its `size` is below `first`, the bytes of this ABI's first layout
// of it: "fn: what->size is N, less than ...: fill it with init()".
void check_size(size_t size, size_t first, const char *fn, const char *what, const char *init);
// Zeroes a size-prefixed configuration and records the caller's `size`; false, writing nothing,
// for a struct smaller than this ABI's layout of it (the _init_size calls, which cannot fail).
template <class T> bool init_sized(T *config, size_t size) noexcept {
    if (!config || size < sizeof *config) return false;
    *config = T{};
    config->size = size;
    return true;
}
// A flags argument with a bit this release does not define.
void check_flags(unsigned long flags, unsigned long known, const char *fn);

template <class F> zb_status guard(F &&body) noexcept {
    try {
        body();
        return ZB_OK;
    } catch (const Error &e) {
        set_last_error(e.what());
        return e.status();
    } catch (const std::bad_alloc &) {
        set_last_error("out of memory");
        return ZB_ENOMEM;
    } catch (const std::exception &e) {
        set_last_error(e.what());
        return ZB_EINTERNAL;
    } catch (...) {
        set_last_error("unknown internal error");
        return ZB_EINTERNAL;
    }
}

} // namespace zb
