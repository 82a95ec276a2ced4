// The zenbind subcommands; argv holds the arguments after the subcommand's name.
#pragma once

namespace zb::cli {

int cmd_plan(int argc, char **argv);
int cmd_show(int argc, char **argv);

} // namespace zb::cli
