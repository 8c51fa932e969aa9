"""cffi build script for mpicoll's C kernels (out-of-line API mode).

setup.py names this file in ``cffi_modules``; pip builds the extension
``mpicoll._kernels`` from it at install time. The header kernels.h is both
the C include and the cffi declaration (its preprocessor lines are stripped
for cdef), so the two cannot drift apart.

Environment knobs:
  MPICOLL_CFLAGS   extra compiler flags (``make sanitize`` passes ASan/UBSan here)
"""
import os
import shlex

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = ["reduce.c", "cast.c", "compress.c", "shmsync.c"]


def _cdef_text():
    with open(os.path.join(HERE, "kernels.h")) as f:
        return "\n".join(line for line in f if not line.lstrip().startswith("#"))


ffibuilder = FFI()
ffibuilder.cdef(_cdef_text())
ffibuilder.set_source(
    "mpicoll._kernels",
    '#include "kernels.h"',
    sources=[os.path.relpath(os.path.join(HERE, s)) for s in SOURCES],
    include_dirs=[os.path.relpath(HERE)],
    # -O3 for the vectoriser; no -ffast-math: NaN and signed-zero rules matter.
    # Strict aliasing stays on (bits are reinterpreted with memcpy); -Wall
    # -Wextra so that a new warning shows in every build log.
    extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-Wextra"]
    + shlex.split(os.environ.get("MPICOLL_CFLAGS", "")),
    extra_link_args=shlex.split(os.environ.get("MPICOLL_LDFLAGS", "")),
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
