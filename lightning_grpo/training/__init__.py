"""Training: the LightningModule and what one optimizer step computes.

Holds :class:`~lightning_grpo.training.module.GRPOModule` (the Lightning hooks),
:class:`~lightning_grpo.training.sft.SFTModule` (supervised warm start), the policy both build alike
(:mod:`.policy`), the forward layouts that turn a rollout batch into per-token log-probs (:mod:`.forward`;
padded, packed: :mod:`.packing`; shared prefix: :mod:`.prefix`), on-policy distillation (:mod:`.distill`)
and the step's metrics (:mod:`.metrics`).

May import: ``core``, ``models``, ``rollout`` (its data classes). Nothing here imports ``data``,
``checks``, ``callbacks``, ``agents``, ``integrations`` or ``cli``.
"""
