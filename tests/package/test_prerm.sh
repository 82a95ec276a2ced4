#!/bin/sh
# zenflow-bind-slurm's prerm/%preun against plugin stacks as sites lay them out, under DPKG_ROOT
# (dpkg's root for installing into a directory): it refuses a removal while any file of the
# stack Slurm reads loads the plugin as required, and lets everything else through.
#   test_prerm.sh SOURCE_DIR
set -eu
script=$1/contrib/packaging/scripts/zenflow-bind-slurm.prerm
root=$(mktemp -d "${TMPDIR:-/tmp}/zb prerm.XXXXXX") # (a space in DPKG_ROOT too)
trap 'rm -rf "$root"' EXIT
failures=0
required='required /usr/lib/x86_64-linux-gnu/slurm-wlm/zenflow_bind.so train=2'

# expect CASE WANT(0|1) [ACTION]: the script's exit status on the tree built so far, then a clean one
expect() {
  status=0
  DPKG_ROOT=$root sh "$script" "${3:-remove}" >"$root.out" 2>&1 || status=$?
  if [ "$status" != "$2" ]; then
    echo "FAIL: $1: exit $status, want $2: $(cat "$root.out")"
    failures=$((failures + 1))
  elif [ "$2" = 1 ] && ! grep -q "loads the plugin as required" "$root.out"; then
    echo "FAIL: $1: no reason given: $(cat "$root.out")"
    failures=$((failures + 1))
  else
    echo "ok: $1"
  fi
  rm -rf "${root:?}"/* "$root.out"
}
put() { # put PATH LINE...: a file under the root
  mkdir -p "$root$(dirname "$1")"
  f=$1
  shift
  printf '%s\n' "$@" >"$root$f"
}

expect "no Slurm configuration" 0
put /etc/slurm/plugstack.conf "$required"
expect "required in plugstack.conf" 1
put /etc/slurm/plugstack.conf "$required"
expect "an upgrade (Debian)" 0 upgrade
put /etc/slurm/plugstack.conf "$required"
expect "an upgrade (RPM)" 0 1
put /etc/slurm/plugstack.conf "$required"
expect "an erase (RPM)" 1 0
put /etc/slurm/plugstack.conf "#$required" "optional zenflow_bind.so" "required other.so"
expect "commented out, optional, another plugin" 0
put /etc/slurm/plugstack.conf "include /etc/slurm/plugstack.conf.d/*.conf"
put /etc/slurm/plugstack.conf.d/zenflow_bind.conf "  $required"
expect "the package's snippet, included" 1
put /etc/slurm/plugstack.conf "include plugstack.conf.d/*.conf" "include site/*.conf   # the site's"
put /etc/slurm/plugstack.conf.d/other.conf "optional other.so"
put /etc/slurm/site/zb.conf "required zenflow_bind.so"
expect "relative includes, each from the including file's directory" 1
mkdir -p "$root/etc/slurm/plugstack.conf.d"
printf 'include /etc/slurm/plugstack.conf.d/*.conf' >"$root/etc/slurm/plugstack.conf"
put /etc/slurm/plugstack.conf.d/zenflow_bind.conf "$required"
expect "an include on a last line without its newline" 1
put /etc/slurm/slurm.conf "ClusterName=c" "plugstackconfig = /opt/slurm/stack.conf # here"
put /opt/slurm/stack.conf "include /opt/slurm/stack.d/*"
put /opt/slurm/stack.d/a "$required"
expect "slurm.conf's PlugStackConfig, any case, and its include" 1
put /etc/slurm/slurm.conf 'PlugStackConfig="/opt/slurm/stack.conf"'
put /opt/slurm/stack.conf "$required"
expect "a quoted PlugStackConfig" 1
put /run/slurm/conf/plugstack.conf "$required"
expect "configless: slurmd's copy in /run/slurm/conf" 1
put /etc/slurm/slurm.conf "SlurmdSpoolDir=/var/lib/slurm/slurmd"
put /var/lib/slurm/slurmd/conf-cache/plugstack.conf "$required"
expect "configless: the copy in SlurmdSpoolDir/conf-cache" 1
put /etc/slurm/slurm.conf "SlurmdSpoolDir=/var/spool/slurmd.%n"
put /var/spool/slurmd.node1/conf-cache/plugstack.conf "$required"
expect "configless: SlurmdSpoolDir with the node's name (%n)" 1
put /etc/slurm/plugstack.conf "include /etc/slurm/plugstack.conf" "optional zenflow_bind.so"
expect "a file that includes itself ends" 0
# The same file is the RPM's %preun, which rpmbuild macro-expands: it must come out as it is.
if command -v rpm >/dev/null; then
  if [ "$(rpm --eval "$(cat "$script")" 2>&1)" = "$(cat "$script")" ]; then
    echo "ok: rpmbuild's macro expansion leaves it as it is"
  else
    echo "FAIL: rpm --eval changes it: $(rpm --eval "$(cat "$script")" 2>&1 | head -3)"
    failures=$((failures + 1))
  fi
fi
[ "$failures" = 0 ] || exit 1
