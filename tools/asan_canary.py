"""Proof that the sanitizer build is live (``make sanitize``): call the C
kernel directly, past the end of a 100-element buffer. Under ASan this
must abort with a heap-buffer-overflow report; "no report" means the
instrumentation is missing."""
import numpy as np

from mpicoll._kernels import ffi, lib

a = np.ones(100, np.float32)
d = np.empty(100, np.float32)
lib.mpicoll_reduce(0, 10, ffi.from_buffer(d), ffi.from_buffer(a), ffi.from_buffer(a), 101)  # one too many
print("no report")
