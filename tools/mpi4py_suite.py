"""mpi4py's own collective tests, run through ``mpicoll.Comm``.

    python tools/mpi4py_suite.py [--nprocs 1 2 3] [--dir build/mpi4py-tests] [--timeout 600]

Fetches the test files of the installed mpi4py version from PyPI (the
sdist, unpacked into --dir; nothing of it is kept in this repository), then
runs, for each process count, ``mpiexec -n N python -m mpi4py`` on this
script in worker mode: it imports mpi4py's test modules (FILES), makes every
test's ``self.COMM`` an ``mpicoll.Comm`` over the communicator the test
chose (``MPI.COMM_WORLD``, ``COMM_SELF`` or their duplicates), adds
test_msgspec's vector-spec tests (on an ``mpicoll.Comm`` of COMM_SELF), runs them
with unittest and prints, per process count, the pass/fail/skip counts and
which mpi4py methods ``mpicoll.Comm`` served and which it handed to mpi4py
(``mpicoll.dropin.count_calls``). Exit status 1 on any failure or timeout.
"""
from __future__ import annotations

import argparse
import collections
import glob
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# The buffer collectives: blocking, nonblocking, persistent; block and vector forms.
FILES = ["test_cco_buf", "test_cco_vec", "test_cco_nb_buf", "test_cco_nb_vec", "test_cco_pr_buf",
         "test_cco_pr_vec", "test_msgspec"]
# test_msgspec's vector-spec classes: mpi4py's message_vector rules, on
# COMM_SELF.Alltoallv (the module's own helper, pointed at an mpicoll.Comm).
MSGSPEC = "test_msgspec"
MSGSPEC_CLASSES = ("TestMessageVector", "TestMessageVectorArray", "TestMessageVectorNumPy")
# Tests mpicoll.Comm cannot pass by design, with the reason: (module, class, test).
SKIP = {}


# ---- driver ---------------------------------------------------------------------------

def fetch_tests(version: str, dest: str) -> str:
    """mpi4py's test/ folder of ``version`` under ``dest`` (downloaded once)."""
    testdir = os.path.join(dest, f"mpi4py-{version}", "test")
    if os.path.isfile(os.path.join(testdir, "mpiunittest.py")):
        return testdir
    os.makedirs(dest, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        base = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "mpi4py", "-q",
                f"mpi4py=={version}", "-d", tmp]
        # pip prepares the sdist's metadata: with this venv's setuptools when
        # it has one (seconds), else in an isolated build environment.
        if subprocess.run(base + ["--no-build-isolation"], capture_output=True).returncode != 0:
            subprocess.run(base, check=True)
        (sdist,) = glob.glob(os.path.join(tmp, "mpi4py-*.tar.gz"))
        prefix = f"mpi4py-{version}/test/"
        with tarfile.open(sdist) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix) and m.isfile()]
            # The "data" filter (no links out, no absolute paths) where this Python has it.
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(dest, members=members, **safe)
    return testdir


def drive(args) -> int:
    import mpi4py
    testdir = fetch_tests(mpi4py.__version__, args.dir)
    mpiexec = [os.path.join(os.path.dirname(sys.executable), "mpiexec")] + \
        os.environ.get("MPIEXEC_FLAGS", "").split()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    status = 0
    summary = []
    for n in args.nprocs:
        with tempfile.NamedTemporaryFile("r", suffix=".json", dir=args.dir) as report:
            t0 = time.monotonic()
            cmd = ["timeout", str(args.timeout)] + mpiexec + ["-n", str(n), sys.executable, "-m", "mpi4py",
                                                               os.path.abspath(__file__), "--worker", testdir,
                                                               "--report", report.name] + \
                (["--verbose"] if args.verbose else []) + (["--plain"] if args.plain else [])
            how = "plain mpi4py" if args.plain else "through mpicoll.Comm"
            print(f"== mpiexec -n {n}: mpi4py {mpi4py.__version__}'s {', '.join(FILES)}, {how}", flush=True)
            rc = subprocess.run(cmd, env=env).returncode
            took = time.monotonic() - t0
            text = report.read()
        if rc != 0 or not text:
            print(f"p={n}: FAILED (exit status {rc}{', timed out' if rc == 124 else ''}) after {took:.0f} s")
            summary.append(f"p={n}: failed, exit status {rc}")
            status = 1
            continue
        res = json.loads(text)
        summary.append(f"p={n}: {res['passed']} passed, {res['failed']} failed, {res['skipped']} skipped "
                       f"({took:.0f} s)")
        status |= res["failed"] > 0
    print("\n".join(["== summary"] + summary))
    return status


# ---- worker (one rank) -------------------------------------------------------------

def _wrap_comm(cls, mpicoll, MPI):
    """Give every test of ``cls`` an mpicoll.Comm over the communicator it set up."""
    setup = cls.setUp

    def setUp(self):  # noqa: N802 (unittest's name)
        setup(self)
        comm = getattr(self, "COMM", None)
        if isinstance(comm, MPI.Intracomm) and comm != MPI.COMM_NULL and not isinstance(comm, mpicoll.Comm):
            self.COMM = mpicoll.Comm(comm)

    cls.setUp = setUp


def _suite(testdir: str, mpicoll, MPI, plain: bool):
    sys.path.insert(0, testdir)
    loader = unittest.TestLoader()
    suite = unittest.TestSuite()
    for name in FILES:
        if not os.path.exists(os.path.join(testdir, name + ".py")):
            continue  # not in this mpi4py version
        mod = __import__(name)
        if name == MSGSPEC and not plain:
            self_comm = mpicoll.Comm(MPI.COMM_SELF)
            mod.Alltoallv = lambda smsg, rmsg: self_comm.Alltoallv(smsg, rmsg)
        for obj in list(vars(mod).values()):
            if isinstance(obj, type) and issubclass(obj, unittest.TestCase) and hasattr(obj, "COMM") and not plain:
                _wrap_comm(obj, mpicoll, MPI)
        for test in _flatten(loader.loadTestsFromModule(mod)):
            if name == MSGSPEC and type(test).__name__ not in MSGSPEC_CLASSES:
                continue
            cls = type(test)
            reason = SKIP.get((name, cls.__name__, test._testMethodName))
            if reason is not None:
                setattr(cls, test._testMethodName, unittest.skip(reason)(getattr(cls, test._testMethodName)))
            suite.addTest(test)
    return suite


def _flatten(suite):
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from _flatten(t)
        else:
            yield t


def work(args) -> int:
    from mpi4py import MPI

    import mpicoll
    from mpicoll import dropin

    world = MPI.COMM_WORLD
    suite = _suite(args.worker, mpicoll, MPI, args.plain)
    calls = dropin.count_calls()
    # --verbose: rank 0 names each test as it runs (where a run stalls).
    stream = sys.stdout if args.verbose and world.rank == 0 else io.StringIO()
    result = unittest.TextTestRunner(stream=stream, verbosity=2 if args.verbose else 0).run(suite)
    dropin.count_calls(False)
    failures = [(str(t), tb) for t, tb in result.failures + result.errors]
    mine = dict(passed=result.testsRun - len(failures) - len(result.skipped), failed=len(failures),
                skipped=len(result.skipped), failures=failures, skips=[(str(t), r) for t, r in result.skipped],
                calls=[[list(k), v] for k, v in calls.items()])
    everyone = world.gather(mine, root=0)
    if world.rank != 0:
        return 0
    total = collections.Counter()
    for r in everyone:
        for key, v in r["calls"]:
            total[tuple(key)] += v
    names = sorted({k[0] for k in total})
    print(f"{'method':28s} {'mpicoll':>8s} {'mpi4py':>8s}   (calls, all ranks)")
    for name in names:
        print(f"{name:28s} {total[name, 'mpicoll']:8d} {total[name, 'mpi4py']:8d}")
    why = collections.Counter()
    for key, v in total.items():
        if len(key) == 3:
            why[key[2]] += v
    print("handed to mpi4py, why (calls, all ranks):")
    for reason, v in why.most_common():
        print(f"  {v:8d}  {reason}")
    worst = max(everyone, key=lambda r: r["failed"])
    for test, tb in worst["failures"][:10]:
        print(f"FAIL {test}\n{tb}")
    for test, reason in sorted(set(tuple(s) for s in everyone[0]["skips"])):
        print(f"skip {test}: {reason}")
    res = dict(passed=min(r["passed"] for r in everyone), failed=worst["failed"], skipped=everyone[0]["skipped"])
    print(f"p={world.size}: {res['passed']} passed, {res['failed']} failed, {res['skipped']} skipped", flush=True)
    if args.report:
        with open(args.report, "w") as f:
            json.dump(res, f)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nprocs", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--dir", default=os.path.join(ROOT, "build", "mpi4py-tests"),
                    help="where the downloaded test files are kept")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per mpiexec run")
    ap.add_argument("--verbose", action="store_true", help="rank 0 names each test as it runs")
    ap.add_argument("--plain", action="store_true", help="plain mpi4py communicators (the baseline)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--report", help=argparse.SUPPRESS)
    args = ap.parse_args()
    return work(args) if args.worker else drive(args)


if __name__ == "__main__":
    sys.exit(main())
