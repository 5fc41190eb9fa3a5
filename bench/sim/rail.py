#!/usr/bin/env python3
"""Writes a rail-optimised two-level SMPI platform for NP ranks (bench/sim/run.sh --rail).

   bench/sim/rail.py NP PLATFORM.xml HOSTFILE

Nodes of 8 ranks, as in cluster.xml, with the same link speeds, but wired
as GPU clusters are (one NIC per accelerator, e.g. 8 per DGX node):
  - inside a node every rank has its own 20 GB/s, 0.5 us full-duplex port
    into a non-blocking switch (NVSwitch-like);
  - between nodes every rank has its own 10 Gbit/s (1.25 GB/s), 5 us
    full-duplex NIC into a non-blocking 1 us backbone.
cluster.xml instead gives a node one NIC its 8 ranks share, which is what
makes flat gossip lose there (docs/benchmarks.md). Both platforms keep the
inter-node link 16x slower than the intra-node one.

SimGrid's <cluster> cannot give a host two links, so this is a Full routing
zone with one explicit route per ordered pair of ranks (NP^2 routes: about
8 MB of XML at 256 ranks, parsed in seconds).
"""
import sys

RANKS_PER_NODE = 8


def host(r):
    return f"node-{r // RANKS_PER_NODE}-{r % RANKS_PER_NODE}"


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    np_ = int(sys.argv[1])
    if np_ < 1:
        sys.exit(f"rail.py: NP must be >= 1, got {np_}")
    with open(sys.argv[2], "w") as f:
        w = f.write
        w("<?xml version='1.0'?>\n<!DOCTYPE platform SYSTEM \"https://simgrid.org/simgrid.dtd\">\n")
        w('<platform version="4.1">\n<zone id="rail" routing="Full">\n')
        for r in range(np_):
            w(f'  <host id="{host(r)}" speed="1Gf"/>\n')
        for r in range(np_):
            w(f'  <link id="nvl-{r}" bandwidth="20GBps" latency="0.5us" sharing_policy="SPLITDUPLEX"/>\n')
            w(f'  <link id="nic-{r}" bandwidth="1.25GBps" latency="5us" sharing_policy="SPLITDUPLEX"/>\n')
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
    with open(sys.argv[3], "w") as f:
        for r in range(np_):
            f.write(host(r) + "\n")


if __name__ == "__main__":
    main()
