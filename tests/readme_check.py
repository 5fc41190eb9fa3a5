#!/usr/bin/env python3
"""README contract: its C++ example is examples/quickstart.cpp verbatim (which the
suite compiles and runs), and it holds exactly two shell commands: the bench suite
and the test command that .ci/run executes."""
import re
import sys

root = sys.argv[1]
readme = open(f"{root}/README.md").read()
example = open(f"{root}/examples/quickstart.cpp").read()

cpp = re.findall(r"```cpp\n(.*?)```", readme, re.S)
sh = re.findall(r"```sh\n(.*?)```", readme, re.S)
errors = []
if len(cpp) != 1 or cpp[0] != example:
    errors.append("README's ```cpp block differs from examples/quickstart.cpp")
if len(sh) != 2:
    errors.append(f"README must hold exactly two ```sh commands, found {len(sh)}")
else:
    for i, block in enumerate(sh):
        lines = [l for l in block.strip().splitlines() if l.strip()]
        if len(lines) != 1:
            errors.append(f"sh block {i + 1} must be one command line, has {len(lines)}")
    if "bench/suite.sh" not in sh[0]:
        errors.append("first command must run the bench suite (bench/suite.sh)")
    if "meson test" not in sh[1]:
        errors.append("second command must run meson test")
ci = open(f"{root}/.ci/run").read()
if "n==2" not in ci:
    errors.append(".ci/run no longer runs README's second command")
for e in errors:
    print("FAIL:", e)
sys.exit(1 if errors else 0)
