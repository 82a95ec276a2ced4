// `zenbind tune`: measure where the Adam step saturates each NUMA node and write a profile.
#pragma once

// argv holds the arguments after "tune"; returns the process exit status.
int zb_cli_tune(int argc, char **argv);
