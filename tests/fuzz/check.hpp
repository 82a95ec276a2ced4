// A property check for fuzz targets: a violated property aborts, which libFuzzer reports as a
// crash together with the input that caused it.
#pragma once

#include <cstdio>
#include <cstdlib>

#define ZB_FUZZ_CHECK(cond)                                                                        \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            std::fprintf(stderr, "property violated at %s:%d: %s\n", __FILE__, __LINE__, #cond);   \
            std::abort();                                                                          \
        }                                                                                          \
    } while (0)
