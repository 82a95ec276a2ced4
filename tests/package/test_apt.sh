#!/usr/bin/env bash
# The Debian packages as an admin installs them: `apt-get install ./*.deb` on this machine, then
# what users run, through the installed files only (no build-tree path, no ZENFLOW_* variable):
# the Python package starts the installed worker, zenbind plans, and srun --zenflow-bind binds
# through the installed plugin on a throwaway cluster. The packages are purged at the end, also
# on failure.   usage: test_apt.sh BUILD_DIR SOURCE_DIR      (root; exits 77 elsewhere)
. "$(dirname "$0")/common.sh"
build=$1 src=$2
. "$(dirname "$0")/../skip.sh"
[ "$(id -u)" -eq 0 ] || skip "needs root (apt-get install)"
command -v slurmd >/dev/null || skip "Slurm is not installed"
pkgs=(libzenbind$so libzenbind-dev zenflow-bind zenflow-bind-slurm python3-zenflow-bind)
for p in "${pkgs[@]}"; do
  if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed'; then
    skip "$p is already installed on this machine; this test would remove it"
  fi
done

cluster="$src/scripts/cluster.sh"
snippet=/etc/slurm/plugstack.conf.d/zenflow-bind.conf
cleanup() {
  "$cluster" stop "$work/cluster" >/dev/null 2>&1 || true
  [ -f "$snippet" ] && sed -i 's/^required /#required /' "$snippet" # (as the admin must)
  DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq "${pkgs[@]}" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
bash "$src/tests/package/test_deb.sh" "$build" "$work/out" >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$work"/out/*.deb \
  >"$work/apt.log" 2>&1 || { cat "$work/apt.log"; exit 1; }
echo "ok   apt-get install ${pkgs[*]}"

clean_env=(env -u ZENFLOW_BIND_LIB -u ZENFLOW_OPTIMIZER -u PYTHONPATH -u LD_LIBRARY_PATH)
(cd "$work" && "${clean_env[@]}" /usr/bin/python3 "$src/tests/package/installed_step.py" \
  /usr/lib/python3/dist-packages)
"${clean_env[@]}" zenbind plan --tasks 2 --synthetic "pack:2 [numa] core:4 pu:2" >/dev/null
echo "ok   zenbind plan"

multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
plugin=/usr/lib/$multiarch/slurm-wlm/zenflow_bind.so
"$cluster" start "$work/cluster" --task-plugin cgroup --plugin "$plugin" --lifetime 300 >/dev/null
export SLURM_CONF=$work/cluster/etc/slurm.conf
line=$(srun -n1 -c2 --zenflow-bind=verbose bash -c 'echo "train=$ZENFLOW_TRAIN_CPUS opt=$ZENFLOW_OPT_CPUS"' 2>"$work/srun.err")
grep -q "task 0 (rank 0): train" "$work/srun.err" || { cat "$work/srun.err"; exit 1; }
case "$line" in "train="?*" opt="?*) echo "ok   srun --zenflow-bind through the installed plugin: $line" ;;
*) echo "FAIL srun --zenflow-bind printed '$line'"; cat "$work/srun.err"; exit 1 ;; esac

# The installed DDP example, as a user runs it: the package's optimizer with register_ddp(), one
# rank per task, nothing pointing into the source tree
example=/usr/share/doc/python3-zenflow-bind/examples/train_ddp.py
port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
ddp=$(cd "$work" && "${clean_env[@]}" MASTER_PORT="$port" srun -n2 -c1 --zenflow-bind \
  /usr/bin/python3 "$example" --steps 5 2>&1) || { echo "$ddp"; exit 1; }
sums=$(printf '%s\n' "$ddp" | sed -n 's/^rank [01]: parameters sum //p' | sort -u)
[ "$(printf '%s\n' "$sums" | wc -l)" = 1 ] && [ -n "$sums" ] || { echo "FAIL $example:"; echo "$ddp"; exit 1; }
echo "ok   the installed train_ddp.py on two srun tasks (both ranks end at $sums)"

# A build for another Slurm release, installed by hand over the working one, is refused before
# dpkg unpacks it: the plugin Slurm loads stays (else every srun fails to load it).
other="$work/other"
dpkg-deb -R "$(ls "$work"/out/zenflow-bind-slurm_*.deb)" "$other"
sed -i 's/slurm-wlm-basic-plugins (>= [^)]*), slurm-wlm-basic-plugins (<< [^)]*)/slurm-wlm-basic-plugins (>= 99.05), slurm-wlm-basic-plugins (<< 99.05.99)/' \
  "$other/DEBIAN/control"
grep -q "99.05.99" "$other/DEBIAN/control" || { echo "FAIL no Slurm pin in the control file"; exit 1; }
dpkg-deb -b "$other" "$work/other.deb" >/dev/null
before=$(md5sum <"$plugin")
if dpkg -i "$work/other.deb" >"$work/other.log" 2>&1; then
  echo "FAIL dpkg -i installed a plugin for Slurm 99.05"; exit 1
fi
status=$(dpkg-query -W -f='${Status}' zenflow-bind-slurm)
if [ "$status" != "install ok installed" ] || [ "$(md5sum <"$plugin")" != "$before" ]; then
  echo "FAIL dpkg -i of a build for Slurm 99.05 left the package '$status', plugin replaced:"
  cat "$work/other.log"; exit 1
fi
echo "ok   a build for another Slurm release is refused before it is unpacked"

# Removing the plugin while the snippet loads it as required would fail every srun on the host:
# refused, saying what to do; once the line is commented out, removal and purge go through, and
# leave no byte-code behind (root's import above made some).
sed -i '0,/^#required /s//required /' "$snippet"
if DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq zenflow-bind-slurm >"$work/rm.log" 2>&1; then
  echo "FAIL zenflow-bind-slurm was removed while $snippet loads it"; exit 1
fi
grep -q "Comment that line out" "$work/rm.log" || { cat "$work/rm.log"; exit 1; }
echo "ok   removal refused while the snippet loads the plugin"
sed -i 's/^required /#required /' "$snippet"
DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq "${pkgs[@]}" >"$work/purge.log" 2>&1 ||
  { cat "$work/purge.log"; exit 1; }
if [ -e /usr/lib/python3/dist-packages/zenflow_bind ] || [ -e "$snippet" ]; then
  echo "FAIL purge left $(ls -d /usr/lib/python3/dist-packages/zenflow_bind "$snippet" 2>/dev/null)"
  exit 1
fi
echo "ok   purged, nothing left"
echo "1 passed, 0 failed"
