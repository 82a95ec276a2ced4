// One line to the user's standard error, prefixed "zenflow-bind: ". Never blocks or fails a task.
#pragma once

#include <string>

namespace zb::spank {

void tell_user(const std::string &line);

} // namespace zb::spank
