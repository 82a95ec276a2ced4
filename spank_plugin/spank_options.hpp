// How the admin's plugstack.conf arguments and the user's --zenflow-bind value combine into the
// options a step runs with. Pure: no Slurm calls, so srun validates with the same rules the
// slurmstepd applies later.
#pragma once

#include <zenbind/zenbind.h>

#include <string>

namespace zb::spank {

// Parses plugstack.conf arguments (each one key[=value] or a comma list) in admin scope.
// On failure `error` names the argument and the key.
bool parse_admin(int argc, char **argv, zb_options &admin, std::string &error);

struct Resolved {
    zb_options options; // admin values overlaid with the user's
    bool enabled;       // bind this step at all
};

// `user_text` is the option's value, "" for a bare --zenflow-bind, nullptr when the option was
// not given. Refuses user keys that change what the admin fixed under override=deny.
bool resolve(const zb_options &admin, const char *user_text, Resolved &out, std::string &error);

} // namespace zb::spank
