#!/usr/bin/env python3
"""Prints what a torch C++ extension compiles and links with, for meson:
line 1 the compile flags, line 2 the include directories, line 3 the link
flags (each ';'-separated). Exits 1 when torch does not import (meson then
leaves the extension out and the torch tests report torch missing)."""
import os
import sys

try:
    import torch
    from torch.utils import cpp_extension
except ImportError as e:
    print(f"torch_flags.py: {e}", file=sys.stderr)
    sys.exit(1)

cflags = [f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
          "-DTORCH_API_INCLUDE_EXTENSION_H", "-DTORCH_EXTENSION_NAME=torch_gradsync"]
# The pybind11 ABI tags torch was built with: without the same ones our
# module cannot see torch's Store, ProcessGroup and Reducer classes.
for tag in ("COMPILER_TYPE", "STDLIB", "BUILD_ABI"):
    v = getattr(torch._C, f"_PYBIND11_{tag}", None)
    if v is not None:
        cflags.append(f'-DPYBIND11_{tag}="{v}"')
libs = []
for d in cpp_extension.library_paths():
    libs += [f"-L{d}", f"-Wl,-rpath,{d}"]
libs += ["-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]
print(";".join(cflags))
print(";".join(d for d in cpp_extension.include_paths() if os.path.isdir(d)))
print(";".join(libs))
