"""Summarise valgrind logs and fail on errors attributable to mpicoll.

    python tools/valgrind_check.py /tmp/vg.*.log

An error is mpicoll's when any frame of its stack is in mpicoll's C kernels
(the _kernels, _executor_* and _native_* extensions and their C files) or in mpicoll's Python package.
Everything else (CPython, ld.so, glibc, MPICH) is counted and listed by the
top frame, so a reader can see what the suppressions did not cover.
Exit status 1 if any error is mpicoll's or a log has no ERROR SUMMARY.
"""
import collections
import re
import sys

OURS = re.compile(r"_kernels|_executor_|_native_|/csrc/|reduce\.c|cast\.c|compress\.c|shmsync\.c|executor\.c|"
                  r"native\.c|/mpicoll/")
HEAD = re.compile(r"^==\d+== (Invalid|Conditional|Use of|Syscall|Source and|Mismatched|Argument)")


def errors(path):
    blocks, cur = [], None
    with open(path, errors="replace") as f:
        for line in f:
            if HEAD.match(line):
                cur = [line.rstrip()]
                blocks.append(cur)
            elif cur is not None and re.match(r"^==\d+==\s+(at|by) ", line):
                cur.append(line.rstrip())
            else:
                cur = None
    return blocks


def main(paths):
    bad, other, summaries = [], collections.Counter(), []
    for path in paths:
        text = open(path, errors="replace").read()
        m = re.search(r"ERROR SUMMARY: (\d+) errors from (\d+) contexts \(suppressed: (\d+)", text)
        if not m:
            print(f"{path}: no ERROR SUMMARY (valgrind did not finish)")
            return 1
        summaries.append((path, m.group(0)))
        for block in errors(path):
            if any(OURS.search(line) for line in block[1:]):
                bad.append((path, block))
            else:
                top = block[1].split(":", 1)[-1].strip() if len(block) > 1 else "?"
                other[f"{block[0].split('== ', 1)[1]} @ {top}"] += 1
    for path, s in summaries:
        print(f"{path}: {s}")
    for what, n in other.most_common():
        print(f"  not mpicoll ({n}x): {what}")
    for path, block in bad:
        print(f"MPICOLL ERROR in {path}:\n" + "\n".join(block))
    print(f"errors attributable to mpicoll: {len(bad)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
