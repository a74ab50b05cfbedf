#!/usr/bin/env bash
# Run a command with its whole process tree held to CPUS CPUs' worth (default 1) by a cgroup CPU quota: a
# machine this many times slower than this one, for checking that tests and plans do not depend on the
# machine's speed (root only; cgroup v2 or v1's cpu controller). The quota covers every child, the vLLM
# server's engine and workers included; the cgroup is removed when the command ends.
#
#   sudo benchmarks/one_cpu.sh pytest -m real_server        # the real-server phase on one CPU's worth
#   CPUS=0.5 benchmarks/one_cpu.sh python benchmarks/bench_capacity.py
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: [CPUS=1] $0 COMMAND [ARG ...]" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "error: a cgroup CPU quota needs root" >&2; exit 2; }
cpus="${CPUS:-1}"
period=100000
quota=$(python3 -c "import sys; q = float(sys.argv[1]); assert q > 0; print(int(q * $period))" "$cpus" 2>/dev/null) \
    || { echo "error: CPUS: expected a positive number of CPUs, got '$cpus'" >&2; exit 2; }
name="syncsafe-quota-$$"
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then          # cgroup v2
    group="/sys/fs/cgroup/$name"
    mkdir "$group"
    echo "$quota $period" > "$group/cpu.max"
else                                                          # cgroup v1: the cpu controller's hierarchy
    group="/sys/fs/cgroup/cpu/$name"
    mkdir "$group"
    echo "$period" > "$group/cpu.cfs_period_us"
    echo "$quota" > "$group/cpu.cfs_quota_us"
fi
cleanup() {
    # what is left in the group goes back to the root group, then the group goes
    if [ -f "$group/cgroup.procs" ]; then
        root="$(dirname "$group")"
        while read -r pid; do echo "$pid" > "$root/cgroup.procs" 2>/dev/null || true; done < "$group/cgroup.procs"
        rmdir "$group" 2>/dev/null || true
    fi
}
trap cleanup EXIT
echo "$(basename "$0"): ${cpus} CPU(s) worth for: $*" >&2
# the command runs in a child shell that joins the group first: everything it starts is held with it
( echo "$BASHPID" > "$group/cgroup.procs"; exec "$@" )
