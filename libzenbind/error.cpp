#include "error.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace {
thread_local std::string last_error;
}

namespace zb {

void fail_errno(const std::string &what) {
    const int err = errno;
    fail(ZB_ESYS, what + ": " + std::strerror(err));
}

void set_last_error(const char *message) noexcept {
    try {
        last_error = message;
    } catch (...) {
        last_error.clear(); // the message did not fit in memory; the status still tells
    }
}

void check_size(size_t size, size_t first, const char *fn, const char *what, const char *init) {
    if (size < first)
        fail(ZB_EINVAL, std::string(fn) + ": " + what + "->size is " + std::to_string(size) +
                            ", less than the " + std::to_string(first) + " bytes of its first " +
                            "layout in this ABI: fill it with " + init + "()");
}

void check_flags(unsigned long flags, unsigned long known, const char *fn) {
    if (flags & ~known) {
        char hex[32];
        std::snprintf(hex, sizeof hex, "%#lx", flags & ~known);
        fail(ZB_EINVAL, std::string(fn) + ": flags " + hex + ": this release defines " +
                            (known ? "other bits" : "none (pass 0)"));
    }
}

} // namespace zb

extern "C" {

const char *zb_last_error(void) {
    return last_error.c_str();
}

const char *zb_status_name(zb_status status) {
    switch (status) {
    case ZB_OK:
        return "OK";
    case ZB_EINVAL:
        return "EINVAL";
    case ZB_ENOMEM:
        return "ENOMEM";
    case ZB_ESYS:
        return "ESYS";
    case ZB_ETOPOLOGY:
        return "ETOPOLOGY";
    case ZB_EIMPOSSIBLE:
        return "EIMPOSSIBLE";
    case ZB_ETIMEDOUT:
        return "ETIMEDOUT";
    case ZB_EDEAD:
        return "EDEAD";
    case ZB_EVERSION:
        return "EVERSION";
    case ZB_EINTERNAL:
        return "EINTERNAL";
    case ZB_ENOENT:
        return "ENOENT";
    }
    return "EUNKNOWN";
}

const char *zb_version(void) {
    return ZB_VERSION_STRING;
}

unsigned zb_api_version(void) {
    return ZB_API_VERSION;
}
}
