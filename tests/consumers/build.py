#!/usr/bin/env python3
"""Builds and runs one outside project under tests/consumers/ against this
gradsync tree, the way a user would vendor it:

  build.py meson-wrap SRC      a Meson project with subprojects/gradsync.wrap
                               (wrap-file over a release tarball made from SRC)
  build.py pkgconfig-make SRC  a plain Makefile, pkg-config against
                               `meson install --destdir` of SRC
  build.py cmake SRC           CMake find_package(gradsync CONFIG) against the
                               same kind of install

Each copies the consumer into a fresh temporary directory (nothing is written
into the source tree), builds it, runs it, and fails unless the program prints
"gradsync <version> via <path>: ok" with the version meson.build declares."""
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
# What a gradsync release tarball holds: enough to configure it as a subproject.
# The consumers check that gradsync is found, compiles and works, not how
# fast: unoptimised builds keep the three of them to seconds of test time.
CONSUMER_OPT = "-O0"
RELEASE = ["meson.build", "meson_options.txt", "LICENSE", "include", "cmake"]


def sh(*cmd, cwd=None, env=None):
    print("+", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(r.stdout, end="", flush=True)
    if r.returncode != 0:
        sys.exit(f"build.py: `{' '.join(cmd)}` exited {r.returncode}")
    return r.stdout


def project_version(src):
    m = re.search(r"project\('gradsync'.*?version:\s*'([^']+)'", open(os.path.join(src, "meson.build")).read(), re.S)
    if not m:
        sys.exit("build.py: no version in meson.build")
    return m.group(1)


def copy_consumers(tmp):
    dst = os.path.join(tmp, "consumers")
    shutil.copytree(HERE, dst, ignore=shutil.ignore_patterns("__pycache__", "build.py"))
    return dst


def install(src, tmp):
    """meson setup + meson install --destdir of SRC (headers, .pc, CMake config); returns the prefix as staged."""
    build, root, prefix = os.path.join(tmp, "gs-build"), os.path.join(tmp, "root"), "/usr/local"
    sh("meson", "setup", build, src, f"--prefix={prefix}", "-Dtests=false", "-Dbench=false", "-Dexamples=false",
       "-Dcuda=disabled", "-Dmpi=disabled", "-Dtorch=disabled")
    sh("meson", "install", "-C", build, "--destdir", root, "--quiet")
    return root, root + prefix


def find(top, name):
    for d, _, files in os.walk(top):
        if name in files:
            return os.path.join(d, name)
    sys.exit(f"build.py: {name} was not installed under {top}")


def run_consumer(exe, how, version):
    out = sh(exe, how)
    want = f"gradsync {version} via {how}: ok"
    if want not in out:
        sys.exit(f"build.py: consumer printed {out!r}, expected {want!r}")


def meson_wrap(src, tmp, version):
    c = copy_consumers(tmp)
    proj = os.path.join(c, "meson-wrap")
    tarball = os.path.join(tmp, f"gradsync-{version}.tar.gz")
    with tarfile.open(tarball, "w:gz") as t:
        for f in RELEASE:
            t.add(os.path.join(src, f), arcname=f"gradsync-{version}/{f}",
                  filter=lambda i: None if "__pycache__" in i.name else i)
    digest = hashlib.sha256(open(tarball, "rb").read()).hexdigest()
    cache = os.path.join(proj, "subprojects", "packagecache")
    os.makedirs(cache)
    shutil.copy(tarball, cache)
    tmpl = open(os.path.join(proj, "subprojects", "gradsync.wrap.in")).read()
    wrap = tmpl.replace("@VERSION@", version).replace("@SHA256@", digest).replace("@URL@", "file://" + tarball)
    open(os.path.join(proj, "subprojects", "gradsync.wrap"), "w").write(wrap)
    build = os.path.join(tmp, "build")
    out = sh("meson", "setup", build, proj, "--wrap-mode=nodownload", "-Dbuildtype=plain")
    if "gradsync" not in out or "Subproject gradsync" not in out:
        sys.exit("build.py: meson did not configure gradsync as a subproject")
    sh("ninja", "-C", build)
    run_consumer(os.path.join(build, "consumer"), "meson-wrap", version)


def pkgconfig_make(src, tmp, version):
    root, staged = install(src, tmp)
    pc = find(staged, "gradsync.pc")
    env = dict(os.environ, PKG_CONFIG_PATH=os.path.dirname(pc), PKG_CONFIG_SYSROOT_DIR=root,
               PKG_CONFIG_LIBDIR=os.path.dirname(pc))
    got = sh("pkg-config", "--modversion", "gradsync", env=env).strip()
    if got != version:
        sys.exit(f"build.py: pkg-config says gradsync {got}, meson.build {version}")
    cflags = sh("pkg-config", "--cflags", "gradsync", env=env)
    if os.path.join(staged, "include") not in cflags:
        sys.exit(f"build.py: --cflags {cflags!r} do not point into the staged install")
    proj = os.path.join(copy_consumers(tmp), "pkgconfig-make")
    sh("make", "-C", proj, f"OPT={CONSUMER_OPT}", env=env)
    run_consumer(os.path.join(proj, "consumer"), "pkgconfig-make", version)


def cmake(src, tmp, version):
    _, staged = install(src, tmp)
    cfg = find(staged, "gradsyncConfig.cmake")
    find(staged, "gradsyncConfigVersion.cmake")
    proj = os.path.join(copy_consumers(tmp), "cmake")
    build = os.path.join(tmp, "build")
    sh("cmake", "-S", proj, "-B", build, f"-DCMAKE_PREFIX_PATH={staged}", "-DCMAKE_BUILD_TYPE=",
       f"-DCMAKE_CXX_FLAGS={CONSUMER_OPT}")
    cache = open(os.path.join(build, "CMakeCache.txt")).read()
    if f"gradsync_DIR:PATH={os.path.dirname(cfg)}" not in cache:
        sys.exit("build.py: CMake did not find the staged gradsyncConfig.cmake")
    sh("cmake", "--build", build)
    run_consumer(os.path.join(build, "consumer"), "cmake", version)


def main():
    ways = {"meson-wrap": meson_wrap, "pkgconfig-make": pkgconfig_make, "cmake": cmake}
    if len(sys.argv) != 3 or sys.argv[1] not in ways:
        sys.exit(f"usage: build.py {{{'|'.join(ways)}}} SRC")
    src = os.path.abspath(sys.argv[2])
    version = project_version(src)
    with tempfile.TemporaryDirectory(prefix="gradsync-consumer-") as tmp:
        # Every command runs in this consumer's own directory: meson's cmake
        # module probes with `cmake --system-information`, which builds a
        # scratch project under the working directory, and two consumers
        # probing in the one they were started in (the test build's) broke
        # each other's ("CMAKE_CXX_COMPILER not set", fresh-clone run of
        # 2026-12-07 10:03).
        here = os.getcwd()
        os.chdir(tmp)
        try:
            ways[sys.argv[1]](src, tmp, version)
        finally:
            os.chdir(here)


if __name__ == "__main__":
    main()
