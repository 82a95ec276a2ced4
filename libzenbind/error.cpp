#include "error.hpp"

#include <cerrno>
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

void clear_last_error() noexcept {
    last_error.clear();
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
    return ZB_VERSION_NUMBER;
}
}
