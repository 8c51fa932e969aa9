"""What ``import mpicoll`` costs every rank of every job: the optional
packages stay out until used (ml_dtypes alone cost ~0.6 s of CPU)."""
import subprocess
import sys

import numpy as np
import pytest


def test_import_leaves_optional_packages_out():
    code = ("import sys, mpicoll; "
            "print(','.join(m for m in ('ml_dtypes', 'torch', 'simgrid') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"import mpicoll imported {out}"


def test_bfloat16_arrays_recognised_once_the_program_imports_ml_dtypes():
    ml = pytest.importorskip("ml_dtypes")
    from mpicoll import dtypes

    x = np.arange(4, dtype=np.float32).astype(ml.bfloat16)
    assert dtypes.resolve(x.dtype) is dtypes.BFLOAT16
    assert dtypes.of_numpy(np.dtype(ml.bfloat16)) is dtypes.BFLOAT16


def test_mpicoll_nonblocking_is_a_deprecated_alias():
    """The module of re-exports is gone from the import graph; old code
    that reaches through it gets the package's own objects and a warning."""
    code = ("import sys, warnings, mpicoll; assert 'mpicoll.nonblocking' not in sys.modules; "
            "warnings.simplefilter('error'); "
            "assert mpicoll.set_progress_thread and mpicoll.progress_thread_active and mpicoll.progress\n"
            "for name in ('iallreduce', 'waitall', 'Request', 'set_progress_thread'):\n"
            "    try:\n"
            "        getattr(mpicoll.nonblocking, name)\n"
            "    except DeprecationWarning as w:\n"
            "        assert f'mpicoll.{name}' in str(w), w\n"
            "    else:\n"
            "        raise SystemExit(f'no warning for {name}')\n"
            "warnings.simplefilter('ignore')\n"
            "assert mpicoll.nonblocking.iallreduce is mpicoll.iallreduce\n"
            "assert mpicoll.nonblocking.names() == mpicoll.algorithms('allreduce')\n"
            "print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.stdout.strip() == "ok", proc.stdout + proc.stderr
