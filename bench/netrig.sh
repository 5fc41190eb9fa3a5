#!/usr/bin/env bash
# bench/netrig.sh: the slow-link rig. Emulates two machines joined by one
# shaped Ethernet link (1 Gbit/s by default) on this single host, and runs a
# command as a 2-rank MPI job across it: rank 0 in one network namespace,
# rank 1 in another, joined by a veth pair whose two directions are each
# shaped by tc (tbf at --rate, netem delay in front of it when --delay > 0).
#
# Why: two ranks on one host talk through shared memory at memcpy speed, so
# a bench there can never show what gradient compression is for: saving
# time on a link that is far slower than memory. Here every MPI byte crosses
# the shaped link over TCP. Measured with MPICH 4.0.2 ch4:ucx: the namespaces
# still share /dev/shm and one pid namespace, so with UCX's default
# transports (posix/sysv/cma) a 64 MiB allreduce moves 0 bytes over the veth;
# UCX_TLS=tcp,self with UCX_NET_DEVICES=rig0 sends it all through the link.
# MPIR_CVAR_NOLOCAL=1 makes MPICH's node map put each rank on its own node,
# as on two machines (MPI_Comm_split_type(SHARED) gives singletons, so
# gradsync calibrates a global, not a local, alpha/beta; no shm path either).
# At the end the bytes the link carried are printed: a run that bypassed it
# shows ~0 MB.
#
# Usage:
#   bench/netrig.sh [--rate 1gbit] [--delay 0ms] [--keep] -- CMD ARGS...
#       runs `mpiexec -n 1 ip netns exec NS0 CMD : -n 1 ip netns exec NS1 CMD`
#       (hydra's fork launcher; PMI reaches the ranks over inherited fds, which
#       cross namespaces); exits with the job's status.
#   bench/netrig.sh [--rate R] [--delay D] --check
#       self-test: sets up, streams over TCP (python3) in each direction and
#       fails unless the goodput is within 15% of --rate.
# --rate takes tc's units: bit kbit mbit gbit tbit (powers of 1000) or bps
# kbps mbps gbps (bytes/s). --delay is one-way, per direction (the RTT is
# twice it): us, ms or s. --keep leaves the namespaces up and prints how to
# remove them. Needs root and iproute2 (ip, tc); rig messages go to stderr.
# Example: bench/netrig.sh -- build/bench/gradsync-bench allreduce -t mpi -b 64M -e 64M
set -euo pipefail

me=bench/netrig.sh
die() { echo "$me: $*" >&2; exit 2; }
say() { echo "netrig: $*" >&2; }
usage() { sed -n '/^# Usage:/,/^# Example:/s/^# \{0,1\}//p' "$0" >&2; exit 2; }

rate=1gbit delay=0ms keep=0 check=0
while [ $# -gt 0 ]; do
  case $1 in
    --rate) [ $# -ge 2 ] || die "--rate needs a value"; rate=$2; shift 2 ;;
    --rate=*) rate=${1#*=}; shift ;;
    --delay) [ $# -ge 2 ] || die "--delay needs a value"; delay=$2; shift 2 ;;
    --delay=*) delay=${1#*=}; shift ;;
    --keep) keep=1; shift ;;
    --check) check=1; shift ;;
    -h|--help) usage ;;
    --) shift; break ;;
    *) die "unknown option '$1' (the command goes after --; see --help)" ;;
  esac
done
if [ "$check" = 1 ]; then
  [ $# -eq 0 ] || die "--check takes no command"
else
  [ $# -gt 0 ] || die "no command (usage: $me [--rate R] [--delay D] [--keep] -- CMD ARGS...)"
fi

[ "$(id -u)" -eq 0 ] || die "must run as root (network namespaces and tc need CAP_NET_ADMIN); try: sudo $0 ..."
for t in ip tc; do
  command -v "$t" >/dev/null || die "'$t' not found: apt-get install -y iproute2"
done
command -v awk >/dev/null || die "awk not found: apt-get install -y mawk"
if [ "$check" = 1 ]; then
  command -v python3 >/dev/null || die "--check needs python3"
else
  mpiexec=${MPIEXEC:-mpiexec}
  command -v "$mpiexec" >/dev/null || die "'$mpiexec' not found (set MPIEXEC or apt-get install -y mpich)"
fi

# Rate in bits/s and delay in microseconds, as integers (awk: bash has no floats).
rate_bits=$(awk -v s="$rate" 'BEGIN {
  s = tolower(s); if (!match(s, /^[0-9]+(\.[0-9]+)?/)) exit 1
  n = substr(s, 1, RLENGTH); u = substr(s, RLENGTH + 1)
  m["bit"] = 1; m["kbit"] = 1e3; m["mbit"] = 1e6; m["gbit"] = 1e9; m["tbit"] = 1e12
  m["bps"] = 8; m["kbps"] = 8e3; m["mbps"] = 8e6; m["gbps"] = 8e9
  if (!(u in m) || n * m[u] < 8e3) exit 1; printf "%.0f\n", n * m[u] }') ||
  die "bad --rate '$rate' (e.g. 1gbit, 100mbit, 125mbps; at least 8kbit)"
delay_us=$(awk -v s="$delay" 'BEGIN {
  s = tolower(s); if (!match(s, /^[0-9]+(\.[0-9]+)?/)) exit 1
  n = substr(s, 1, RLENGTH); u = substr(s, RLENGTH + 1)
  m["us"] = 1; m["ms"] = 1e3; m["s"] = 1e6; m[""] = (n == 0) ? 1 : -1
  if (!(u in m) || m[u] < 0) exit 1; printf "%.0f\n", n * m[u] }') ||
  die "bad --delay '$delay' (e.g. 0ms, 500us, 2ms)"
rate_Bps=$((rate_bits / 8))

# Unique per run, so concurrent rigs and stale --keep leftovers don't collide.
ns0=gsrig0-$$ ns1=gsrig1-$$
dev=rig0 addr0=10.77.0.1 addr1=10.77.0.2
tmp=$(mktemp -d)
child=

# shellcheck disable=SC2317 # reached through the traps
teardown() {
  local rc=$?
  trap - EXIT INT TERM
  if [ "$keep" = 1 ]; then
    say "--keep: left up; remove with: ip netns del $ns0; ip netns del $ns1"
  else
    # Anything still running inside our namespaces was started by this run.
    local ns pids
    for ns in "$ns0" "$ns1"; do
      pids=$(ip netns pids "$ns" 2>/dev/null) || continue
      # shellcheck disable=SC2086 # a list of pids
      [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
      ip netns del "$ns" 2>/dev/null || true   # takes the veth pair with it
    done
  fi
  rm -rf "$tmp"
  exit "$rc"
}
# shellcheck disable=SC2317 # reached through the traps
on_signal() {
  # The job runs in the background (so this trap runs at once, not when it
  # ends): pass the signal on, let hydra clean up its ranks, then tear down.
  say "interrupted; tearing down"
  [ -z "$child" ] || { kill -TERM "$child" 2>/dev/null || true; wait "$child" 2>/dev/null || true; }
  exit "$1"
}
trap teardown EXIT
trap 'on_signal 130' INT
trap 'on_signal 143' TERM

# Token bucket: 2 ms worth of bytes (>= 32 KiB). Measured on veth at 1 Gbit/s:
# 16 KiB reaches only ~80% of the rate, 256 KiB ~96% (TCP goodput, i.e. all
# of it but the headers), 1 MiB barely more (~97%) but longer bursts above it.
burst=$((rate_Bps / 500)); [ "$burst" -ge 32768 ] || burst=32768
# netem holds a delay's worth of packets before tbf; room for twice that.
netem_limit=$((rate_Bps * delay_us * 2 / 1000000 / 1500)); [ "$netem_limit" -ge 1000 ] || netem_limit=1000

ip netns add "$ns0" || die "cannot create network namespace $ns0"
ip netns add "$ns1" || die "cannot create network namespace $ns1"
# Both ends named rig0 in their own namespace: one UCX_NET_DEVICES serves both ranks.
ip link add "$dev" netns "$ns0" type veth peer name "$dev" netns "$ns1" || die "cannot create the veth pair"
ip -n "$ns0" addr add "$addr0/24" dev "$dev"
ip -n "$ns1" addr add "$addr1/24" dev "$dev"
for ns in "$ns0" "$ns1"; do
  ip -n "$ns" link set lo up
  ip -n "$ns" link set "$dev" up
  # Egress on each end: together both directions are shaped.
  if [ "$delay_us" -gt 0 ]; then
    ip netns exec "$ns" tc qdisc add dev "$dev" root handle 1: netem delay "${delay_us}us" limit "$netem_limit" 2>/dev/null ||
      die "tc netem failed: this kernel lacks the netem qdisc (CONFIG_NET_SCH_NETEM); run without --delay"
    parent=(parent 1:1 handle 10:)
  else
    parent=(root handle 1:)
  fi
  ip netns exec "$ns" tc qdisc add dev "$dev" "${parent[@]}" tbf rate "${rate_bits}bit" burst "$burst" latency 10ms ||
    die "tc tbf failed on $ns"
done

if [ "$delay_us" -gt 0 ]; then lat="one-way delay ${delay_us}us per direction"; else lat="no added delay"; fi
# The carrier comes up asynchronously (linkwatch); UCX skips a device that
# is not running yet, so wait for both ends before starting anything.
for ((i = 0; ; i++)); do
  up=0
  for ns in "$ns0" "$ns1"; do
    [ "$(ip netns exec "$ns" cat "/sys/class/net/$dev/operstate")" != up ] || up=$((up + 1))
  done
  [ "$up" -lt 2 ] || break
  [ "$i" -lt 100 ] || die "the veth pair did not come up within 5 s"
  sleep 0.05
done

say "two hosts over one shaped link, $lat"
say "  rate   $rate = $rate_bits bit/s = $(awk -v b="$rate_Bps" 'BEGIN { printf "%.1f", b / 1e6 }') MB/s per direction (L2 frames; TCP goodput ~95% of it)"
say "  rank 0 netns $ns0 $dev $addr0/24    rank 1 netns $ns1 $dev $addr1/24"
say "  qdisc  $(ip netns exec "$ns0" tc qdisc show dev "$dev" | tr '\n' ' ')"

tx_bytes() { ip netns exec "$1" cat "/sys/class/net/$dev/statistics/tx_bytes"; }
mb() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1e6 }'; }

if [ "$check" = 1 ]; then
  # One TCP stream of ~1 s of data per direction; the receiver times it from
  # accept to EOF. The sender's connect() takes one round trip.
  py='import socket, sys, time
mode, host, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "recv":
    srv = socket.create_server((host, 5201)); srv.settimeout(30)
    c, _ = srv.accept(); c.settimeout(60)
    t0 = time.monotonic(); got = 0; buf = bytearray(1 << 20)
    while (k := c.recv_into(buf)): got += k
    print(got, time.monotonic() - t0)
else:
    end = time.monotonic() + 10
    while True:
        try:
            t0 = time.monotonic(); c = socket.create_connection((host, 5201), timeout=10); break
        except ConnectionRefusedError:
            if time.monotonic() > end: raise
            time.sleep(0.02)
    rtt = time.monotonic() - t0; buf = memoryview(bytes(1 << 20))
    while n > 0: c.sendall(buf[:min(n, len(buf))]); n -= len(buf)
    c.close(); print(rtt)'
  n=$rate_Bps; [ "$n" -ge 262144 ] || n=262144
  fail=0
  for dir in "$ns0 $ns1 $addr1" "$ns1 $ns0 $addr0"; do
    read -r from to to_addr <<<"$dir"
    ip netns exec "$to" python3 -c "$py" recv "$to_addr" "$n" >"$tmp/recv" &
    recv=$!
    rtt=$(ip netns exec "$from" python3 -c "$py" send "$to_addr" "$n")
    wait "$recv" || die "receiver in $to failed"
    read -r got secs <"$tmp/recv"
    [ "$got" -eq "$n" ] || die "receiver in $to got $got of $n bytes"
    line=$(awk -v g="$got" -v s="$secs" -v r="$rate_Bps" -v t="$rtt" -v d="$delay_us" 'BEGIN {
      bw = g / s; printf "%.1f MB in %.3f s = %.1f MB/s (%.1f%% of the rate)", g / 1e6, s, bw / 1e6, 100 * bw / r
      if (d > 0) printf ", RTT (connect) %.2f ms, expected %.2f", 1e3 * t, 2e-3 * d
      print (bw > 0.85 * r && bw < 1.15 * r) ? " ok" : " FAIL" }')
    say "check ${from%-*} -> ${to%-*}: $line"
    case $line in *FAIL) fail=1 ;; esac
  done
  [ "$fail" = 0 ] || { say "check FAILED: goodput not within 15% of $rate"; exit 1; }
  say "check passed"
  exit 0
fi

# UCX over TCP on the veth only: its shm/cma transports would cross the
# namespaces (shared /dev/shm and pids) and bypass the link. NOLOCAL: the two
# ranks share a hostname, so MPICH would otherwise call them one node.
export UCX_TLS=tcp,self UCX_NET_DEVICES=$dev MPIR_CVAR_NOLOCAL=1
say "  env    UCX_TLS=$UCX_TLS UCX_NET_DEVICES=$UCX_NET_DEVICES MPIR_CVAR_NOLOCAL=$MPIR_CVAR_NOLOCAL"
say "  run    $mpiexec -launcher fork -n 1 ip netns exec $ns0 $* : -n 1 ip netns exec $ns1 $*"
tx0=$(tx_bytes "$ns0") tx1=$(tx_bytes "$ns1")
"$mpiexec" -launcher fork -n 1 ip netns exec "$ns0" "$@" : -n 1 ip netns exec "$ns1" "$@" &
child=$!
status=0
wait "$child" || status=$?
child=
say "link carried $(mb $(($(tx_bytes "$ns0") - tx0))) MB rank 0 -> 1, $(mb $(($(tx_bytes "$ns1") - tx1))) MB rank 1 -> 0; job exit status $status"
exit "$status"
