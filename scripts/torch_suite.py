"""PyTorch's own backend-agnostic distributed tests, run on a backend under mpiexec.

    python scripts/torch_suite.py                            # gloo and mpicoll, world sizes 2 and 3
    python scripts/torch_suite.py --backends mpicoll --sizes 2 -k 'all_gather|barrier'

torch ships the tests of its distributed front end, the ones every backend
must pass, as ``DistributedTest._DistTestBase`` in
``torch/testing/_internal/distributed/distributed_test.py``. torch runs
each test in freshly spawned processes, one per rank (``TestDistBackend._run``):
each initialises the default group (``init_process_group(backend=BACKEND,
rank=..., world_size=...)``), meets the others at a file-based barrier
(``TEMP_DIR``), runs the test method and destroys the group.

Here each MPI rank plays one of those processes, for test after test in one
``mpiexec`` job: the group comes from the ``mpi://`` rendezvous, and
``BACKEND``, ``WORLD_SIZE``, ``TEMP_DIR`` and ``INIT_METHOD`` (``mpi://``, for
the tests that initialise a group themselves) are set as torch's runner sets
them. A test's outcome is torch's rule (``_check_return_codes``): failed if
any rank raised, else skipped if rank 0 skipped, else passed. A test that
has not ended on every rank within ``--timeout`` seconds (a hang, or a rank
left waiting by another's failure) aborts the job; it is recorded as failed
and a new job goes on with the next test. Every test gets the same treatment
on either backend, gloo or mpicoll.

DistTestCases.backend_feature lists the backends that support DDP,
subgroups and plugins by name; "mpicoll" is added to those (not to the GPU
ones) so that those tests run for mpicoll as they do for gloo instead of
skipping. Many tests still name the backends they run for ("Only gloo
backend supports timeouts", ``require_backend_is_available({"gloo"})``) and
skip for any other; the pseudo-backend ``mpicoll-as-gloo`` runs them on
mpicoll anyway: the suite's module sees ``BACKEND="gloo"`` (its decorators
and its CPU code paths), but the default group, and so every collective of
``dist.group.WORLD`` and of every ``new_group()`` without a backend, is
mpicoll's. Tests that make groups with ``backend=BACKEND`` then use gloo for
those, and tests that expect gloo's own error messages fail: read its
failures test by test.

torch's test utilities import ``expecttest``, which torch's wheel does not
install: ``make test-torch-suite`` installs it into build/torch-suite-deps
(``--deps``), outside the project's environment.

The results (one JSON object per test and backend and world size) go to
``--out`` (default build/torch-suite); the summary table and, for every test
gloo passes that mpicoll does not, the reason, are printed at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# Tests tied to gloo by name: their subject is a gloo-only API or option.
GLOO_ONLY = re.compile(r"monitored_barrier")


# ---- one MPI rank: run the tests it is given ------------------------------------

def _worker(tests: list[str], backend: str, results: str, timeout: float) -> None:
    import threading
    import traceback
    import unittest
    from datetime import timedelta

    from mpi4py import MPI

    world = MPI.COMM_WORLD
    ctl = world.Dup()  # the runner's own messages never meet a test's
    rank, size = world.Get_rank(), world.Get_size()
    suite_backend = "gloo" if backend == "mpicoll-as-gloo" else backend  # what distributed_test sees
    backend = backend.split("-as-")[0]  # what the default group runs on
    os.environ.update(BACKEND=suite_backend, WORLD_SIZE=str(size), INIT_METHOD="mpi://")

    import torch.distributed as dist
    from torch.testing._internal import common_distributed as cd
    from torch.testing._internal import common_utils

    import mpicoll.torch  # noqa: F401  (the mpi:// rendezvous and the "mpicoll" backend)

    if suite_backend == "mpicoll":
        for feature in ("ddp", "subgroup", "plugin"):
            cd.DistTestCases.backend_feature[feature].add(backend)
    from torch.testing._internal.distributed import distributed_test as dt

    class Suite(dt.TestDistBackend, dt.DistributedTest._DistTestBase):
        pass

    temp_dir = os.environ["TEMP_DIR"]
    out = open(results, "a") if rank == 0 else None

    def record(obj):
        out.write(json.dumps(obj) + "\n")
        out.flush()

    for name in tests:
        # torch's setUp, done once for all ranks: fresh directories, a fresh file
        # for the tests' own FileStores; every rank restarts the file barrier.
        if rank == 0:
            record({"start": name})
            import shutil
            for sub in ("barrier", "test_dir", "init_dir"):
                shutil.rmtree(os.path.join(temp_dir, sub), ignore_errors=True)
                os.mkdir(os.path.join(temp_dir, sub))
            fd, file_name = tempfile.mkstemp(dir=temp_dir)
            os.close(fd)
        else:
            file_name = None
        file_name = ctl.bcast(file_name, root=0)
        dt.Barrier.barrier_id = 0
        env = dict(os.environ)

        def on_timeout(name=name):
            sys.stderr.write(f"torch_suite: rank {rank}: {name} still running after {timeout:g} s: aborting\n")
            sys.stderr.flush()
            world.Abort(3)

        watchdog = threading.Timer(timeout, on_timeout)
        watchdog.daemon = True
        watchdog.start()
        started = time.monotonic()
        self = Suite(name)
        self.rank = rank
        self.file_name = file_name
        self.skip_return_code_checks = []
        self.special_return_code_checks = {}
        common_utils.set_rng_seed()
        method = getattr(Suite, name)
        try:
            # unittest's own skips (skip_but_pass_in_sandcastle_if, unittest.skipIf)
            # are marks that unittest reads before setUp: torch spawns no process.
            for marked in (Suite, method):
                if getattr(marked, "__unittest_skip__", False):
                    raise unittest.SkipTest(getattr(marked, "__unittest_skip_why__", ""))
            pg_timeout = dt.CUSTOM_PG_TIMEOUT.get(name, dt.default_pg_timeout)
            pg_timeout = pg_timeout if isinstance(pg_timeout, timedelta) else timedelta(seconds=pg_timeout)
            dist.init_process_group(init_method="mpi://", backend=backend, world_size=size, rank=rank,
                                    timeout=pg_timeout)
            self._barrier()
            getattr(self, name)()
            self._barrier()
            dist.destroy_process_group()
            outcome = ("pass", "")
        except unittest.SkipTest as exc:
            outcome = ("skip", str(exc))
        except SystemExit as exc:  # the GPU-count decorators exit with a skip code
            code = exc.code if isinstance(exc.code, int) else 1
            skips = {s.exit_code: s.message for s in cd.TEST_SKIPS.values()}
            outcome = ("pass", "") if code == 0 else ("skip", skips[code]) if code in skips else \
                ("fail", f"exit code {code}")
        except BaseException:
            outcome = ("fail", traceback.format_exc()[-4000:])
        finally:
            if dist.is_initialized():
                try:
                    dist.destroy_process_group()
                except Exception:  # a failed test's group: the next test starts a new one anyway
                    pass
            os.environ.clear()
            os.environ.update(env)
        everyone = ctl.gather(outcome, root=0)
        watchdog.cancel()
        if rank == 0:
            kinds = [k for k, _ in everyone]
            result = "fail" if "fail" in kinds else everyone[0][0]
            detail = "\n".join(f"rank {r}: {d}" for r, (k, d) in enumerate(everyone) if k == "fail") \
                or everyone[0][1]
            record({"test": name, "result": result, "detail": detail,
                    "seconds": round(time.monotonic() - started, 2)})
    if out is not None:
        out.close()


# ---- the driver: jobs, restarts, the summary ------------------------------------

def _all_tests(env) -> list[str]:
    code = ("from torch.testing._internal.distributed import distributed_test as dt\n"
            "print('\\n'.join(n for n in dir(dt.DistributedTest._DistTestBase) if n.startswith('test_')))")
    env = dict(env, BACKEND="gloo", WORLD_SIZE="2", TEMP_DIR=tempfile.gettempdir())
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if proc.returncode:
        hint = " (pip install --target DIR expecttest, then --deps DIR)" if "expecttest" in proc.stderr else ""
        raise SystemExit(f"torch_suite: cannot import torch's distributed tests{hint}:\n{proc.stderr[-2000:]}")
    return proc.stdout.split()


def _run(backend: str, n: int, tests: list[str], args, env) -> dict:
    """Run ``tests`` in as many jobs as it takes; {test: result record}."""
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    results_path = os.path.join(args.out, f"{backend}-{n}.jsonl")
    open(results_path, "w").close()
    done: dict = {}
    todo = list(tests)
    while todo:
        with tempfile.TemporaryDirectory() as temp_dir:
            list_path = os.path.join(temp_dir, "tests")
            with open(list_path, "w") as f:
                f.write("\n".join(todo))
            cmd = [mpiexec, *os.environ.get("MPIEXEC_FLAGS", "").split(), "-n", str(n), sys.executable, "-m",
                   "mpi4py", os.path.abspath(__file__), "--worker", list_path, "--backend", backend,
                   "--results", results_path, "--timeout", str(args.timeout)]
            log_path = os.path.join(args.out, f"{backend}-{n}.log")
            with open(log_path, "a") as log:
                subprocess.run(cmd, env=dict(env, TEMP_DIR=temp_dir), stdout=log, stderr=subprocess.STDOUT,
                               timeout=args.timeout * len(todo) + 120)
        started = None
        with open(results_path) as f:
            for line in f:
                rec = json.loads(line)
                if "start" in rec:
                    started = rec["start"]
                else:
                    done[rec["test"]] = rec
                    started = None
        if started is not None and started not in done:  # the job ended inside this test
            done[started] = {"test": started, "result": "fail", "seconds": None,
                             "detail": f"the job ended during the test (hang past {args.timeout:g} s, or a crash): "
                                       f"see {log_path}"}
            with open(results_path, "a") as f:
                f.write(json.dumps(done[started]) + "\n")
        left = [t for t in todo if t not in done]
        if len(left) == len(todo):  # no progress at all: the job cannot start
            raise SystemExit(f"torch_suite: the {backend} job at n={n} ran no test; see {log_path}")
        todo = left
    return done


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default="gloo,mpicoll,mpicoll-as-gloo",
                    help="gloo, mpicoll, mpicoll-as-gloo (mpicoll, with the suite told it is gloo)")
    ap.add_argument("--sizes", default="2,3", help="world sizes (mpiexec -n)")
    ap.add_argument("-k", default="", help="run only the tests whose name this regular expression matches")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds one test may take on every rank")
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "torch-suite"))
    ap.add_argument("--deps", default=os.path.join(ROOT, "build", "torch-suite-deps"),
                    help="a directory with expecttest (pip install --target DIR expecttest)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--backend", help=argparse.SUPPRESS)
    ap.add_argument("--results", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        with open(args.worker) as f:
            _worker(f.read().split(), args.backend, args.results, args.timeout)
        return
    os.makedirs(args.out, exist_ok=True)
    path = [ROOT, args.deps] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    env.pop("MPICOLL_TIMEOUT", None)
    tests = [t for t in _all_tests(env) if re.search(args.k, t)]
    backends = args.backends.split(",")
    sizes = [int(s) for s in args.sizes.split(",")]
    results = {}
    for n in sizes:
        for backend in backends:
            t0 = time.monotonic()
            results[backend, n] = _run(backend, n, tests, args, env)
            print(f"{backend} n={n}: {len(tests)} tests in {time.monotonic() - t0:.0f} s", flush=True)
    print(f"\n{'backend':16} {'n':>2} {'passed':>7} {'failed':>7} {'skipped':>8}")
    for (backend, n), res in results.items():
        count = {k: sum(r["result"] == k for r in res.values()) for k in ("pass", "fail", "skip")}
        print(f"{backend:16} {n:>2} {count['pass']:>7} {count['fail']:>7} {count['skip']:>8}")
    worse = []
    if "gloo" in backends and "mpicoll" in backends:
        for n in sizes:
            gloo, ours = results["gloo", n], results["mpicoll", n]
            posing = results.get(("mpicoll-as-gloo", n), {})
            for t in tests:
                if gloo[t]["result"] == "pass" and ours[t]["result"] != "pass":
                    # A skip here is the suite's own choice by backend name
                    # ("Only gloo backend supports ..."): what mpicoll does
                    # when the suite is told it is gloo says more.
                    tied = " (tied to gloo by name)" if GLOO_ONLY.search(t) or ours[t]["result"] == "skip" else ""
                    res, detail = ours[t]["result"], ours[t]["detail"]
                    if res == "skip" and t in posing:
                        res = f"skip; as gloo: {posing[t]['result']}"
                        if posing[t]["result"] != "pass":
                            detail = posing[t]["detail"]
                    worse.append((n, t, res, tied, detail))
        print(f"\npassed by gloo, not by mpicoll: {len(worse)}")
        for n, t, res, tied, detail in worse:
            last = [ln for ln in detail.strip().splitlines() if ln.strip()][-1:] or [""]
            print(f"  n={n} {t}: {res}{tied}: {last[0][:200]}")
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump({f"{b}-{n}": res for (b, n), res in results.items()}, f, indent=1)
    sys.exit(1 if any(not tied for _, _, _, tied, _ in worse) else 0)


if __name__ == "__main__":
    main()
