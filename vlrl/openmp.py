"""OpenMP threads per calling thread: torch runs a CPU op from each new thread on a team of its own, as wide as the
machine (a 256 x 1176 cast from a fresh thread with 16 threads set: 16 more threads in the process), whose threads
compete for the cores with everything else the process and its neighbours run (libgomp's threads also spin briefly
after each op before they sleep). A thread that does small tensor work beside busier ones (render workers, the
in-process vLLM driver) limits its own team (:func:`limit_openmp_here`), and lifts the limit around code that reads
its count as the process's (:func:`openmp_threads_here`).

Light module: torch is imported inside the function.
"""

from __future__ import annotations

import ctypes
import functools
import re
from collections.abc import Iterator
from contextlib import contextmanager


def limit_openmp_here(threads: int) -> None:
    """The OpenMP threads of torch's CPU ops run from the calling thread alone. OpenMP keeps the count per thread
    (``omp_set_num_threads`` sets the caller's); ``torch.set_num_threads`` would also set torch's default for every
    thread started later, and MKL's for the whole process. A no-op where no OpenMP runtime is loaded."""
    import torch

    torch.get_num_threads()  # torch's own per-thread init first: it would set the count again on the thread's first op
    for runtime in _openmp_runtimes():
        runtime.omp_set_num_threads(threads)


@contextmanager
def openmp_threads_here(threads: int) -> Iterator[None]:
    """The calling thread's OpenMP count at ``threads`` for the block, its own count back after."""
    import torch

    before = torch.get_num_threads()  # this thread's count (omp_get_max_threads)
    limit_openmp_here(threads)
    try:
        yield
    finally:
        limit_openmp_here(before)


@functools.cache
def _openmp_runtimes() -> tuple[ctypes.CDLL, ...]:
    """The OpenMP runtimes loaded in this process (libgomp, libiomp, libomp), from ``/proc/self/maps`` (Linux)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if re.search(r"/lib(g|i|)omp[\w.-]*\.so", line)}
    except OSError:
        return ()
    libs = [ctypes.CDLL(path) for path in sorted(paths)]
    return tuple(lib for lib in libs if hasattr(lib, "omp_set_num_threads"))  # not an offload runtime (libomptarget)
