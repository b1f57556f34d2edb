"""Which prompts each rank samples for each generation: a pure function of (seed, generation, rank).

The training prompts are read as an endless sequence of shuffled epochs (a new permutation per
epoch, seeded by ``seed`` and the epoch). Generation ``g`` on rank ``r`` of ``W`` takes the ``P``
prompts at positions ``[(g * W + r) * P, (g * W + r + 1) * P)`` of that sequence. Because the
choice depends only on the step, a run resumed from a checkpoint draws exactly the prompts the
uninterrupted run would have drawn, and no two ranks share a prompt within an epoch.
Dynamic-sampling refills read a second sequence with its own seed, indexed by
``(generation, round)``, so they never shift the main schedule.
"""

from __future__ import annotations

from torch import Generator, randperm

#: Offset that separates the refill sequence's seed from the main one.
REFILL_SEED_OFFSET = 1_000_003


def permutation(num_records: int, seed: int, epoch: int, shuffle: bool = True) -> list[int]:
    """The order of the records in ``epoch``: a seeded shuffle, or ``0..n-1`` without shuffling."""
    if not shuffle:
        return list(range(num_records))
    gen = Generator().manual_seed(seed * 1_000_033 + epoch)
    return randperm(num_records, generator=gen).tolist()


def prompt_indices(num_records: int, count: int, slot: int, seed: int, shuffle: bool = True) -> list[int]:
    """Indices of the ``count`` prompts in slot ``slot`` of the shuffled endless sequence."""
    if num_records <= 0:
        raise ValueError("prompt_indices: the prompt set is empty")
    start = slot * count
    out: list[int] = []
    perm_epoch, perm = -1, []
    for pos in range(start, start + count):
        epoch = pos // num_records
        if epoch != perm_epoch:
            perm_epoch, perm = epoch, permutation(num_records, seed, epoch, shuffle)
        out.append(perm[pos % num_records])
    return out


def generation_indices(
    num_records: int, prompts: int, generation: int, seed: int, rank: int, world_size: int, shuffle: bool = True
) -> list[int]:
    """Prompt indices of ``generation`` on ``rank`` (``prompts`` per rank)."""
    return prompt_indices(num_records, prompts, generation * world_size + rank, seed, shuffle)


def refill_indices(
    num_records: int,
    prompts: int,
    generation: int,
    round_: int,
    max_rounds: int,
    seed: int,
    rank: int,
    world_size: int,
    shuffle: bool = True,
) -> list[int]:
    """Prompt indices for dynamic-sampling refill ``round_`` (1-based) of ``generation``."""
    slot = (generation * max_rounds + round_) * world_size + rank
    return prompt_indices(num_records, prompts, slot, seed + REFILL_SEED_OFFSET, shuffle)
