# Warnings and hardening for every target of the project (not for imported ones). Warnings are
# errors only where the project's own checks ask for it (the presets and CI): a packager's or a
# user's build must not depend on the warning set of one compiler release.
option(ZB_WERROR "Treat compiler warnings as errors (the presets and CI turn it on)" OFF)
add_compile_options(-Wall -Wextra)
if(ZB_WERROR)
  add_compile_options(-Werror)
endif()
add_compile_options(-fstack-protector-strong -fno-strict-aliasing)
if(NOT CMAKE_BUILD_TYPE STREQUAL "Debug")
  add_compile_definitions(_FORTIFY_SOURCE=2)
endif()
add_link_options(-Wl,-z,relro,-z,now -Wl,--as-needed)

# ZB_SANITIZE=address,undefined (the asan preset) instruments everything we build.
set(ZB_SANITIZE "" CACHE STRING "Comma-separated -fsanitize= list for every target")
if(ZB_SANITIZE)
  add_compile_options(-fsanitize=${ZB_SANITIZE} -fno-sanitize-recover=all -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${ZB_SANITIZE})
endif()
