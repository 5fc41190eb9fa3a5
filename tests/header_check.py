#!/usr/bin/env python3
"""Writes a translation unit that includes one header and nothing else."""
import sys

header, out = sys.argv[1], sys.argv[2]
with open(out, "w") as f:
    f.write(f"#include <{header}>\n#include <{header}> // include guard works\n")
