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
cleanup() {
  "$cluster" stop "$work/cluster" >/dev/null 2>&1 || true
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
echo "1 passed, 0 failed"
