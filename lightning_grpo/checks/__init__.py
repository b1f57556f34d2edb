"""Checks: a run's configuration cross-checked before any work (one clear error per mistake).

:mod:`.validation` (``check_fit_config``: loss, engine, data, model and recipe against each other),
:mod:`.model_checks` (the loss and the LoRA settings against the model's architecture) and
:mod:`.preflight` (servers and teacher models reachable before training starts).

May import: ``core``, ``models``, ``data``, ``rollout``. Imported by ``callbacks`` and ``cli``.
"""
