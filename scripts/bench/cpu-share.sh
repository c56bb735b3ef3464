#!/bin/sh
# Runs a command inside a CPU quota equal to Lambda's CPU share at a memory size:
#   scripts/bench/cpu-share.sh MB command [args...]
# Lambda gives a full vCPU at 1,769 MB and CPU in proportion below it, so the quota is
# 100 ms x MB / 1769 per 100 ms period (256 MB: 14.47 ms, 0.145 vCPU). The cgroup is
# tgsync-MB under the cgroup v1 `cpu` hierarchy (cpu.cfs_quota_us) or the v2 root
# (cpu.max); needs root. Only this command (and what it starts) is inside the quota.
#   scripts/bench/cpu-share.sh MB --pid PID
# puts a running process (every thread of it) inside the quota instead.
# With TGSYNC_MEMORY_LIMIT=1 the cgroup also caps memory at MB MiB, swap included (v1
# memory.limit_in_bytes and memsw, v2 memory.max and memory.swap.max), as Lambda caps a
# function at its memory size with no swap: a process that needs more is killed by the
# kernel's OOM killer, as Lambda's would be. The v1 peak (memory.max_usage_in_bytes) is
# reset. With --pid the cap holds for what the process allocates from then on only.
set -eu
mb="$1"; shift
period=100000
quota=$((period * mb / 1769))
if [ -e /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]; then
  cg="/sys/fs/cgroup/cpu/tgsync-$mb"
  mkdir -p "$cg"
  echo "$period" >"$cg/cpu.cfs_period_us"
  echo "$quota" >"$cg/cpu.cfs_quota_us"
elif [ -e /sys/fs/cgroup/cgroup.controllers ]; then
  echo +cpu >/sys/fs/cgroup/cgroup.subtree_control
  cg="/sys/fs/cgroup/tgsync-$mb"
  mkdir -p "$cg"
  echo "$quota $period" >"$cg/cpu.max"
else
  echo "cpu-share: no cgroup CPU controller found (cgroup v1 cpu or v2 cpu.max)" >&2
  exit 2
fi
mem=""
bytes=$((mb * 1048576))
if [ "${TGSYNC_MEMORY_LIMIT:-0}" = 1 ]; then
  if [ -d /sys/fs/cgroup/memory ]; then
    mem="/sys/fs/cgroup/memory/tgsync-$mb"
    mkdir -p "$mem"
    # memsw may not be below the limit: lower it after, raise it before.
    if [ -e "$mem/memory.memsw.limit_in_bytes" ]; then
      echo -1 >"$mem/memory.memsw.limit_in_bytes"
      echo "$bytes" >"$mem/memory.limit_in_bytes"
      echo "$bytes" >"$mem/memory.memsw.limit_in_bytes"
    else
      echo "$bytes" >"$mem/memory.limit_in_bytes"
    fi
    echo 0 >"$mem/memory.max_usage_in_bytes"
  else
    echo +memory >/sys/fs/cgroup/cgroup.subtree_control
    echo "$bytes" >"$cg/memory.max"
    if [ -e "$cg/memory.swap.max" ]; then echo 0 >"$cg/memory.swap.max"; fi
  fi
elif [ -e "$cg/memory.max" ]; then
  # v2: the CPU cgroup is shared; an earlier capped run's cap must not linger.
  echo max >"$cg/memory.max"
fi
pid="$$"
if [ "${1:-}" = "--pid" ]; then
  pid="$2"
fi
echo "$pid" >"$cg/cgroup.procs"
if [ -n "$mem" ]; then
  echo "$pid" >"$mem/cgroup.procs"
fi
if [ "${1:-}" = "--pid" ]; then
  exit 0
fi
exec "$@"
