"""Checks: one object's settings checked before any work (one clear error per mistake).

:mod:`.model_checks` (the model source, the reference, the loss, LoRA and the optimizer of the module, and whether a
tokenizer belongs to the policy), :mod:`.preflight` (servers and teacher models reachable before training starts)
and :mod:`.chat_template` (a warning for templates that rewrite earlier turns). The rules across objects are the
run plan's (:mod:`lightning_grpo.plan`), which runs these.

May import: ``core``, ``models``, ``data``, ``rollout``. Imported by ``plan`` and ``cli``.
"""
