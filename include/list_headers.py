#!/usr/bin/env python3
"""Prints every public header below DIR/gradsync, relative to DIR, one per line."""
import os
import sys

root = sys.argv[1]
out = []
for d, _, files in os.walk(os.path.join(root, "gradsync")):
    for f in files:
        if f.endswith((".hpp", ".cuh")):
            out.append(os.path.relpath(os.path.join(d, f), root))
print("\n".join(sorted(out)))
