#!/usr/bin/env python3
"""Writes an SMPI platform and hostfile for NP ranks (bench/sim/run.sh).

   bench/sim/platform.py KIND NP PLATFORM.xml HOSTFILE

Every kind has nodes of 8 ranks (one per core); ranks of a node talk at
20 GB/s, 0.5 us (shared memory, NVLink-like); nodes reach each other through
NICs into a non-blocking 1 us backbone (FATPIPE: flows do not share it, so
it never limits, at 1024 ranks either). `shared` is the former
cluster.xml, `rail` the former rail.py, both unchanged up to 256 ranks.
The <cluster> kinds write no backbone link: its microsecond is in the two
NICs' latencies (5.5 + 5.5 us for `shared`'s 5 + 1 + 5), and it never
limited, so simulated times are the same (64-rank sweep: 393 rows equal
but dbtree's at 8-16 MiB, within 0.8 %). Every inter-node flow crossed it,
which tied all flows into one system for SimGrid's solver: without it a
1024-rank ring allreduce of 1 MiB took 89 s of host time instead of 109.
KIND says how the NICs are wired:
  shared   one 10 Gbit/s (1.25 GB/s), 5 (+ 0.5) us NIC per node, its 8 ranks share
           it (a commodity cluster: inter-node traffic 16x slower than
           intra-node, and 8x more so when all 8 ranks cross at once);
  fast     the same with a 100 Gbit/s (12.5 GB/s), 2 (+ 0.5) us NIC per node;
  rail     one 10 Gbit/s, 5 us NIC per rank (GPU clusters: one NIC per
           accelerator); inside the node every rank has its own 20 GB/s
           full-duplex port into a non-blocking switch (NVSwitch-like).
The shared kinds are SimGrid <cluster>s: one multi-core host per node, whose
loopback carries its ranks' traffic. SimGrid's <cluster> cannot give a host
two links, so `rail` is a Full routing zone with one explicit route per
ordered pair of ranks (NP^2 routes: about 130 MB of XML at 1024 ranks).
"""
import sys

RANKS_PER_NODE = 8
KINDS = {  # NIC bandwidth, NIC latency
    "shared": ("1.25GBps", "5.5us"),
    "fast": ("12.5GBps", "2.5us"),
    "rail": ("1.25GBps", "5us"),
}
HEADER = "<?xml version='1.0'?>\n<!DOCTYPE platform SYSTEM \"https://simgrid.org/simgrid.dtd\">\n"


def shared(np_, bw, lat, f):
    nodes = (np_ + RANKS_PER_NODE - 1) // RANKS_PER_NODE
    f.write(HEADER + '<platform version="4.1">\n')
    f.write(f'  <cluster id="gradsync" prefix="node-" radical="0-{nodes - 1}" suffix="" speed="1Gf" '
            f'core="{RANKS_PER_NODE}" bw="{bw}" lat="{lat}" '
            f'loopback_bw="20GBps" loopback_lat="0.5us"/>\n</platform>\n')
    return [f"node-{r // RANKS_PER_NODE}" for r in range(np_)]


def rail(np_, bw, lat, f):
    def host(r):
        return f"node-{r // RANKS_PER_NODE}-{r % RANKS_PER_NODE}"

    w = f.write
    w(HEADER + '<platform version="4.1">\n<zone id="rail" routing="Full">\n')
    for r in range(np_):
        w(f'  <host id="{host(r)}" speed="1Gf"/>\n')
    for r in range(np_):
        w(f'  <link id="nvl-{r}" bandwidth="20GBps" latency="0.5us" sharing_policy="SPLITDUPLEX"/>\n')
        w(f'  <link id="nic-{r}" bandwidth="{bw}" latency="{lat}" sharing_policy="SPLITDUPLEX"/>\n')
        w(f'  <link id="lo-{r}" bandwidth="20GBps" latency="0.5us" sharing_policy="FATPIPE"/>\n')
    w('  <link id="backbone" bandwidth="50GBps" latency="1us" sharing_policy="FATPIPE"/>\n')
    for s in range(np_):
        for d in range(np_):
            w(f'  <route src="{host(s)}" dst="{host(d)}" symmetrical="NO">')
            if s == d:
                w(f'<link_ctn id="lo-{s}"/>')
            elif s // RANKS_PER_NODE == d // RANKS_PER_NODE:
                w(f'<link_ctn id="nvl-{s}" direction="UP"/><link_ctn id="nvl-{d}" direction="DOWN"/>')
            else:
                w(f'<link_ctn id="nic-{s}" direction="UP"/><link_ctn id="backbone"/>'
                  f'<link_ctn id="nic-{d}" direction="DOWN"/>')
            w("</route>\n")
    w("</zone>\n</platform>\n")
    return [host(r) for r in range(np_)]


def main():
    if len(sys.argv) != 5 or sys.argv[1] not in KINDS:
        sys.exit(__doc__)
    kind, np_ = sys.argv[1], int(sys.argv[2])
    if np_ < 1:
        sys.exit(f"platform.py: NP must be >= 1, got {np_}")
    bw, lat = KINDS[kind]
    with open(sys.argv[3], "w") as f:
        hosts = (rail if kind == "rail" else shared)(np_, bw, lat, f)
    with open(sys.argv[4], "w") as f:
        f.write("".join(h + "\n" for h in hosts))


if __name__ == "__main__":
    main()
