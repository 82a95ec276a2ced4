# Warnings and hardening for every target of the project (not for imported ones).
add_compile_options(-Wall -Wextra -Werror)
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
