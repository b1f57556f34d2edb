"""Training: the LightningModule and what one optimizer step computes.

Holds :class:`~lightning_grpo.training.module.GRPOModule` (the Lightning hooks),
:class:`~lightning_grpo.training.sft.SFTModule` (supervised warm start), the policy both build alike
(:mod:`.policy`), their grouped settings (:mod:`.settings`), the forward layouts that turn a rollout batch into per-token log-probs (:mod:`.forward`;
padded, packed: :mod:`.packing`; shared prefix: :mod:`.prefix`), on-policy distillation (:mod:`.distill`)
and the step's metrics (:mod:`.metrics`).

May import: ``core``, ``models``, ``rollout`` (its data classes). Nothing here imports ``data``,
``checks``, ``plan``, ``callbacks``, ``agents``, ``integrations`` or ``cli``: the callbacks a module brings
(``GRPOModule.configure_callbacks``: the default guards, the step bar) are registered in :mod:`.defaults` by
:mod:`lightning_grpo.callbacks`, and the run plan's batch geometry is handed over (``GRPOModule.use_geometry``).
"""
