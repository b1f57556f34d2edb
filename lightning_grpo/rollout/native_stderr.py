"""Lines that native code (C++, below Python's logging) writes to the process's stderr while the
in-process vLLM engine starts, filtered by their text.

vLLM-CPU binds its memory to a NUMA node through a torch C++ warning (``[W... utils.cpp:68] Warning:
NUMA binding: Using MEMBIND policy ...``): expected, printed at every start, and out of reach of
``logging`` filters. :func:`skip_native_lines` routes file descriptor 2 through a pipe while its
block runs; a thread copies every line to the real stderr as it comes, except those holding one of
:data:`KNOWN_NATIVE_LINES`. Everything else (errors included) still shows, in order.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator

#: Native stderr lines expected while vLLM-CPU starts, each by a piece of its text.
KNOWN_NATIVE_LINES = (b"Warning: NUMA binding: Using MEMBIND policy",)


def _copy_lines(source: int, target: int, skip: tuple[bytes, ...]) -> None:
    """Copy ``source`` to ``target`` line by line until end of file, leaving out the lines with ``skip``."""
    pending = b""
    while chunk := os.read(source, 65536):
        pending += chunk
        *lines, pending = pending.split(b"\n")
        kept = [line + b"\n" for line in lines if not any(piece in line for piece in skip)]
        if kept:
            os.write(target, b"".join(kept))
    if pending and not any(piece in pending for piece in skip):
        os.write(target, pending)
    os.close(source)


@contextlib.contextmanager
def skip_native_lines(skip: tuple[bytes, ...] = KNOWN_NATIVE_LINES) -> Iterator[None]:
    """Leave the stderr lines holding one of ``skip`` out while the block runs (see the module docstring)."""
    sys.stderr.flush()
    saved = os.dup(2)
    read_end, write_end = os.pipe()
    copier = threading.Thread(target=_copy_lines, args=(read_end, saved, skip), daemon=True)
    copier.start()
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # the pipe's last writer closes: the copier reads end of file
        copier.join(timeout=5)  # a child process started in the block may hold the pipe open: it keeps copying
        if not copier.is_alive():
            os.close(saved)
