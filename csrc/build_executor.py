"""Build mpicoll's two modules that call MPI from C against the MPI library
mpi4py runs on, in place: the schedule executor (csrc/executor.c, cffi:
mpicoll/_executor_<mpi>.*.so) and the native calls (csrc/native.c, a
CPython extension on numpy's C API: mpicoll/_native_<mpi>.*.so).

Run it with the virtual environment's Python after installing mpicoll
(``make install`` does)::

    .venv/bin/python csrc/build_executor.py

Unlike the kernels (setup.py, no MPI in sight), the executor calls MPI
itself, so it is compiled against the library's own mpi.h and linked to its
libmpi - one build per MPI library: MPICH's and Open MPI's handles differ in
type and size. The module is named after the library (``_executor_mpich``,
``_executor_openmpi``) so that the two virtual environments, which share one
source tree, do not overwrite each other's; mpicoll/executor.py loads the one
that matches mpi4py's library and runs schedules through the generators when
none was built (everything still works, with Python's per-message cost).

Where mpi.h and libmpi are: the MPI wheels put them in the environment's
include/ and lib/; otherwise the library's compiler wrapper says
(``mpicc -show`` for MPICH, ``mpicc -showme`` for Open MPI).

Environment knobs: MPICOLL_CFLAGS / MPICOLL_LDFLAGS as for the kernels.
"""
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def vendor_tag() -> str:
    """'mpich' or 'openmpi': the library mpi4py was built for and loads."""
    import mpi4py

    mpi4py.rc.initialize = False  # the vendor is known without starting MPI
    from mpi4py import MPI

    name = MPI.get_vendor()[0]
    tags = {"MPICH": "mpich", "Open MPI": "openmpi"}
    if name not in tags:
        raise SystemExit(f"build_executor: no executor for {name!r} (MPICH and Open MPI are supported)")
    return tags[name]


def mpi_flags():
    """(include dirs, library dirs) of the MPI library."""
    prefix = sys.prefix
    inc, lib = os.path.join(prefix, "include"), os.path.join(prefix, "lib")
    if os.path.exists(os.path.join(inc, "mpi.h")) and os.path.exists(os.path.join(lib, "libmpi.so")):
        return [inc], [lib]
    mpicc = shutil.which("mpicc", path=os.path.join(prefix, "bin")) or shutil.which("mpicc")
    if mpicc is None:
        raise SystemExit("build_executor: no mpi.h in this environment and no mpicc on PATH")
    for flag in ("-show", "-showme"):
        try:
            words = shlex.split(subprocess.run([mpicc, flag], capture_output=True, text=True, check=True).stdout)
        except (OSError, subprocess.CalledProcessError):
            continue
        incs = [w[2:] for w in words if w.startswith("-I")]
        libs = [w[2:] for w in words if w.startswith("-L")]
        if incs:
            return incs, libs
    raise SystemExit(f"build_executor: {mpicc} does not say where mpi.h is (-show / -showme)")


def _cdef_text():
    with open(os.path.join(HERE, "executor.h")) as f:
        return "\n".join(line for line in f if not line.lstrip().startswith("#"))


def builder(tag: str) -> FFI:
    incs, libs = mpi_flags()
    ffi = FFI()
    ffi.cdef(_cdef_text())
    ffi.set_source(
        f"mpicoll._executor_{tag}",
        '#include "executor.h"',
        sources=[os.path.join(HERE, "executor.c")],
        include_dirs=[HERE] + incs,
        library_dirs=libs,
        # The run path finds the same libmpi that mpi4py loaded (already in
        # the process by then: the loader reuses it by its soname).
        runtime_library_dirs=libs,
        libraries=["mpi"],
        extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra"]
        + shlex.split(os.environ.get("MPICOLL_CFLAGS", "")),
        extra_link_args=shlex.split(os.environ.get("MPICOLL_LDFLAGS", "")),
    )
    return ffi


def _install(built: str, name: str, tag: str) -> None:
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    dest = os.path.join(ROOT, "mpicoll", f"{name}{suffix}")
    shutil.copyfile(built, dest + ".tmp")
    os.replace(dest + ".tmp", dest)  # a running job never sees half a file
    print(f"build_executor: {os.path.relpath(dest, ROOT)} (against {tag})")


def build_native(tag: str, tmp: str) -> str:
    """csrc/native.c as mpicoll._native_<tag>: a plain CPython extension
    (it reads numpy arrays through numpy's C API, which cffi cannot), built
    by setuptools' build_ext with the same MPI flags as the executor."""
    import numpy
    from setuptools import Distribution, Extension
    from setuptools.command.build_ext import build_ext

    incs, libs = mpi_flags()
    ext = Extension(
        f"_native_{tag}", [os.path.join(HERE, "native.c")], depends=[os.path.join(HERE, "executor.h")],
        include_dirs=[HERE, numpy.get_include()] + incs, library_dirs=libs, runtime_library_dirs=libs,
        libraries=["mpi"],
        extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-missing-field-initializers"]
        + shlex.split(os.environ.get("MPICOLL_CFLAGS", "")),
        extra_link_args=shlex.split(os.environ.get("MPICOLL_LDFLAGS", "")))
    cmd = build_ext(Distribution({"ext_modules": [ext]}))
    cmd.build_temp = os.path.join(tmp, "temp")
    cmd.build_lib = os.path.join(tmp, "lib")
    cmd.ensure_finalized()
    cmd.run()
    return cmd.get_ext_fullpath(ext.name)


def main():
    tag = vendor_tag()
    tmp = os.path.join(ROOT, "build", f"executor-{tag}")
    os.makedirs(tmp, exist_ok=True)
    _install(builder(tag).compile(tmpdir=tmp, verbose=False), f"_executor_{tag}", tag)
    _install(build_native(tag, os.path.join(ROOT, "build", f"native-{tag}")), f"_native_{tag}", tag)


if __name__ == "__main__":
    main()
