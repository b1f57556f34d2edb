"""Callbacks: the Lightning callbacks that drive a run (rollout, guards, curriculum, saving, logging).

:class:`~lightning_grpo.callbacks.rollout.RolloutCallback` samples each generation batch; the guards,
controllers and savers watch and steer training; :mod:`.distributed` keeps multi-process runs from
hanging silently.

May import: ``core``, ``models``, ``data``, ``rollout``, ``training``, ``checks``.
"""
