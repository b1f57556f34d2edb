"""The run plan: what a run derives from its settings, resolved once before any engine starts.

:class:`~lightning_grpo.plan.run_plan.RunPlan` (a frozen dataclass) owns the context length, the batch
geometry, the seeds, the tokenizer source and the settings the engine is built with; its constructor
:meth:`~lightning_grpo.plan.run_plan.RunPlan.resolve` runs every rule that looks at more than one of the
module, the data, the rollout and the Trainer (:mod:`.engine_rules`: the engine's; :mod:`.run_plan`: groups,
lengths, vocabulary), each a one-line error naming the option as written in a recipe.

May import: ``checks``, ``training``, ``rollout``, ``data``, ``models``, ``core``. Imported by ``callbacks``
(the rollout callback resolves or receives the plan) and ``cli`` (which resolves it before ``trainer.fit``).
"""
