"""GRPOModule: the policy (+ reference) and the GRPO-family loss as a LightningModule.

Data flow of one generation batch (``RolloutCallback`` drives the first half):

    prompts -> engine.generate -> rewards -> module.prepare_rollout_batch (advantages,
    old / ref log-probs) -> training_step x R (loss on a micro-batch) -> optimizer step
    -> weight push into the engine

``training_step`` trains on the `RolloutBatch` handed over by
`GRPOModule.use_rollout` (the callback calls it, or you do when you drive rollouts yourself) and
reads the micro-step index from the dataloader batch (``batch["micro"]``).
"""

from __future__ import annotations

import copy
from typing import Any, Protocol, runtime_checkable

import lightning as L
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from ..core import ADVANTAGES, REWARD_AGGREGATIONS, GRPOLoss, TokenLogProbs
from ..core.batch import BatchGeometry, RolloutBatch
from ..core.guards import NonFiniteError
from ..models.fsdp import fsdp_units, shard_policy
from .defaults import MODULE_CALLBACKS
from .distill import DistillContext, Distiller, DistillSettings
from .forward import layout_token_logprobs
from .metrics import StepMetrics, hands_step_metrics_over, quiet_sync_advice, reduce_rollout_metrics, total_grad_norm
from .policy import PolicyMixin, RunData
from .preparation import RolloutPreparationMixin
from .quiet import quiet_lightning_tips, quiet_run_warnings
from .settings import AlgorithmSettings, ForwardSettings, PolicySettings, as_settings, settings_dict

quiet_lightning_tips()  # at import: Lightning advertises when a Trainer is made, before any hook of ours runs


@runtime_checkable
class HeldOutEvaluator(Protocol):
    """A Trainer callback that scores held-out prompt records in its own validation and test hooks
    (RolloutCallback: it owns the engine)."""

    def evaluate(self, module: Any, records: list, split: str) -> dict[str, float]: ...


class GRPOModule(RolloutPreparationMixin, PolicyMixin, L.LightningModule):
    """Policy, optional reference and the GRPO-family objective.

    Args:
        model: a Hugging Face model directory / hub name for ``AutoModelForCausalLM``, or an
            already-built ``nn.Module`` (drop-in use), or a checkpoint / run folder (an SFT run: exported
            once next to it, `lightning_grpo.models.checkpoint_source`), or ``"tiny:<variant>"``
            (chars, tools, text; qwen3 on the real Qwen3 tokenizer): the built-in tiny model, initialised from the
            run's seed (``seed_everything``; ``"tiny:chars@3"`` pins the initialisation to seed 3). Required.
        loss: the composed objective (`GRPOLoss`); default GRPO
            with PPO clipping and token-mean aggregation, beta 0.
        algorithm: advantage estimator, reward aggregation, KL in reward, iterations and optimizer steps per
            generation batch (`AlgorithmSettings`).
        policy: dtype, LoRA, QLoRA, gradient checkpointing and the reference model
            (`PolicySettings`).
        forward: the log-prob path, its chunking, packing, prefix sharing and the rows of a no-grad pass
            (`ForwardSettings`).
        distillation: on-policy distillation / GKD from teachers (`DistillSettings`).
        default_guards: attach the default guard set (`lightning_grpo.callbacks.guard_set`, through ``configure_callbacks``)
            unless the Trainer's callbacks hold a guard already (naming one guard yourself turns them off).
        optimizer: a LightningCLI-style callable (``class_path`` + ``init_args``) taking the parameters.
        lr_scheduler: a LightningCLI-style callable taking the optimizer, or None.

    Under Lightning's ``ModelParallelStrategy`` (``tensor_parallel_size=1``) the policy and the
    reference copy are sharded with FSDP2 in ``configure_model`` (``lightning_grpo.models.fsdp``); both
    log-prob paths work sharded, and RolloutCallback gathers full weights for the vLLM push.

    Example:
        ```python
        import lightning as L
        from lightning_grpo import AlgorithmSettings, GRPOLoss, GRPOModule, PromptDataModule, RolloutCallback

        module = GRPOModule(
            model="Qwen/Qwen2.5-0.5B-Instruct",
            loss=GRPOLoss(policy_loss="ppo", policy_loss_args={"eps_high": 0.28}, aggregation="token_mean"),
            algorithm=AlgorithmSettings(advantage="dr_grpo"),
        )
        data = PromptDataModule(train_files="train.jsonl", tokenizer_path="Qwen/Qwen2.5-0.5B-Instruct")
        L.Trainer(max_steps=500, callbacks=[RolloutCallback()]).fit(module, datamodule=data)
        ```
    """

    def __init__(
        self,
        model: str | nn.Module,
        loss: GRPOLoss | None = None,
        algorithm: AlgorithmSettings = AlgorithmSettings(),  # noqa: B008 - a settings value shown by --help, read and never mutated
        policy: PolicySettings = PolicySettings(),  # noqa: B008 - a settings value shown by --help, read and never mutated
        forward: ForwardSettings = ForwardSettings(),  # noqa: B008 - a settings value shown by --help, read and never mutated
        distillation: DistillSettings | None = None,
        default_guards: bool = True,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__()
        self.algorithm = as_settings(AlgorithmSettings, algorithm)
        self.policy_settings = as_settings(PolicySettings, policy)
        self.forward_settings = as_settings(ForwardSettings, forward)
        self.default_guards = default_guards
        self.save_hyperparameters(
            {
                "algorithm": settings_dict(self.algorithm),
                "policy": settings_dict(self.policy_settings),
                "forward": settings_dict(self.forward_settings),
                "default_guards": default_guards,
            }
        )
        self.loss_fn = loss if loss is not None else GRPOLoss()
        #: the advantage estimator and the reward aggregation of ``algorithm`` (read by the batch preparation)
        self.advantage_variant = ADVANTAGES.variant(self.algorithm.advantage)
        self.reward_aggregation_fn = REWARD_AGGREGATIONS.get(self.algorithm.reward_aggregation)
        #: the coefficient of KL in reward (``value``), fixed or adaptive (``algorithm.kl_in_reward``)
        self.kl_ctrl = self.algorithm.kl_in_reward.build()
        #: the last generation batch's KL in reward and its coefficient (set by the batch preparation, logged)
        self.reward_kl = self.reward_kl_coef = float("nan")
        self.distiller = Distiller.of(distillation, self._distill_context())  # None without distillation
        self._init_policy(model, self.policy_settings, optimizer, lr_scheduler)  # lightning_grpo.training.policy
        self.reference: nn.Module | None = None
        self._rollout_batch: RolloutBatch | None = None
        self._rollout_metrics: dict[str, float] = {}
        self._geometry: BatchGeometry | None = None  # the run plan's, handed over with use_geometry
        #: The loss metrics of the current optimizer step, over all its micro-batches and ranks.
        self.step_metrics = StepMetrics()
        #: Optimizer steps skipped so far (guards; see `skip_optimizer_step`).
        self.skipped_steps = 0
        self._skip_reasons: list[str] = []
        self._grad_norm: Tensor | None = None

    # ----------------------------------------------------------------------------- models
    @property
    def uses_reference(self) -> bool:
        return self.reference_mode != "none"

    @property
    def reference_mode(self) -> str:
        mode = self.policy_settings.reference
        if mode != "auto":
            return mode
        if not (self.loss_fn.needs_reference or self.algorithm.kl_in_reward.coef):
            return "none"
        return "adapter" if self.lora is not None else "copy"

    def configure_model(self) -> None:
        self._build_policy()  # loaded, LoRA / QLoRA, gradient checkpointing (lightning_grpo.training.policy)
        if self.reference_mode == "copy" and self.reference is None:
            self.reference = copy.deepcopy(self.policy).eval().requires_grad_(False)
        if self.distiller is not None:  # teachers loaded and checked against the tokenizer before training
            trainer = self.attached_trainer
            datamodule = trainer.datamodule if trainer is not None else None
            if isinstance(datamodule, RunData):
                self.distiller.build(datamodule.tokenizer, datamodule.train_records)
            else:  # a user's LightningDataModule (or none): no tokenizer or rows of ours to check against
                self.distiller.build(None, None)
        mesh = self.device_mesh  # set by ModelParallelStrategy: shard with FSDP2 over data parallelism
        if mesh is not None and not fsdp_units(self.policy):
            if self.quantization is not None:
                raise NotImplementedError(
                    "model.policy.quantization (QLoRA) does not shard with FSDP2: use strategy ddp or one device"
                )
            if "tensor_parallel" in (mesh.mesh_dim_names or ()) and mesh["tensor_parallel"].size() > 1:
                raise NotImplementedError(
                    "GRPOModule shards with FSDP2 only: use ModelParallelStrategy(tensor_parallel_size=1)"
                )
            dp_mesh = mesh["data_parallel"] if "data_parallel" in (mesh.mesh_dim_names or ()) else mesh
            for model in filter(None, (self.policy, self.reference)):
                shard_policy(model, dp_mesh)

    def configure_callbacks(self) -> list:
        """The callbacks this module brings (`lightning_grpo.training.defaults.MODULE_CALLBACKS`, filled by
        ``lightning_grpo.callbacks``): the default guards, when ``default_guards`` is on and the Trainer holds no
        guard yet (naming any guard in ``trainer.callbacks`` turns the set off); for a ``max_steps`` run with
        Lightning's default progress bar, a bar of the run's steps instead (not ``Epoch 2/-2``); for Lightning's
        default model summary, one line (no table of zero FLOPs)."""
        return [callback for name in MODULE_CALLBACKS for callback in MODULE_CALLBACKS.get(name)(self.trainer, self)]

    def setup(self, stage: str) -> None:
        """Fail fast when torch.distributed was initialised before Lightning's launcher ran (e.g. by a
        vLLM engine built before ``trainer.fit``): Lightning then keeps that group, and with one rank
        per group DDP and the global token counts silently stop synchronising."""
        world = self.trainer.world_size
        initialized = torch.distributed.is_available() and torch.distributed.is_initialized()
        if world > 1 and initialized and torch.distributed.get_world_size() != world:
            raise RuntimeError(
                f"the default torch.distributed process group has {torch.distributed.get_world_size()} rank(s) "
                f"but the Trainer runs {world}: something initialised torch.distributed before trainer.fit "
                "(a vLLM engine built before the fit does). Build rollout engines inside the fit "
                "(RolloutCallback builds its engine lazily) or after Lightning set up the process group."
            )
        quiet_sync_advice(world)  # one process: Lightning's sync_dist advice for the evaluation metrics is wrong
        quiet_run_warnings()

    # ------------------------------------------------------------------------ hand-overs
    def use_rollout(self, batch: RolloutBatch, metrics: dict[str, float] | None = None) -> None:
        """Train the next ``training_step`` calls on ``batch`` (prepared by `prepare_rollout_batch`);
        ``metrics`` (rollout statistics, timings) are logged with the optimizer step's."""
        self._rollout_batch = batch
        self._rollout_metrics = dict(metrics or {})

    @property
    def rollout_batch(self) -> RolloutBatch | None:
        """The generation batch being trained on (None before the first `use_rollout`)."""
        return self._rollout_batch

    @property
    def rollout_metrics(self) -> dict[str, float]:
        """The statistics of that batch's rollout (rewards, lengths, timings), as handed over."""
        return self._rollout_metrics

    def use_geometry(self, geometry: BatchGeometry) -> None:
        """Split each generation batch into optimizer and training steps by ``geometry`` (the run plan's;
        RolloutCallback hands it over in ``setup``)."""
        self._geometry = geometry

    @property
    def geometry(self) -> BatchGeometry:
        """The run's batch geometry: the one handed over, else (rollouts driven by hand) one step per generation
        batch of this module's ``num_iterations`` / ``steps_per_generation`` and the Trainer's
        ``accumulate_grad_batches``, built once."""
        if self._geometry is None:
            self._geometry = BatchGeometry(
                num_iterations=self.algorithm.num_iterations,
                steps_per_generation=self.algorithm.steps_per_generation,
                accumulate=self.trainer.accumulate_grad_batches,
            )
        return self._geometry

    # ------------------------------------------------------------------------- log-probs
    def token_logprobs(self, model: nn.Module, batch: RolloutBatch, compute_entropy: bool = False) -> TokenLogProbs:
        """Log-probs (and entropy) of the completion tokens at the sampling temperature, through
        the path named by ``logprob_path`` (models without a decoder / LM head use "logits"), with a
        shared prefix, packed or padded as ``prefix_sharing`` and ``packing`` say (`.forward`)."""
        return layout_token_logprobs(model, batch, self.forward_settings, compute_entropy=compute_entropy)

    @torch.no_grad()
    def forward_logprobs(self, model: nn.Module, batch: RolloutBatch) -> Tensor:
        """[B, Lc] completion log-probs of ``model`` without gradient, ``forward.rows_per_pass`` rows at a time
        (reference, old, teacher)."""
        with self.precision_context():
            chunks = torch.arange(len(batch)).split(self.forward_settings.rows_per_pass)
            return torch.cat([self.token_logprobs(model, batch.select(rows)).logp for rows in chunks])

    # ------------------------------------------------------------------------- training
    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        full = self._rollout_batch
        if full is None:
            raise RuntimeError(
                "GRPOModule.training_step found no rollouts: add lightning_grpo.RolloutCallback to the "
                "Trainer's callbacks, or call module.use_rollout(batch) yourself before each generation's steps"
            )
        accumulate = self.trainer.accumulate_grad_batches
        step = self.geometry.micro_step(len(full), int(batch["micro"]))
        micro = full.select(step.micro)
        # one all-reduce for the global normalisers of the mini-batch (tokens, sequences, IS-weight mean)
        kept = full.completion_mask if full.keep_mask is None else full.completion_mask * full.keep_mask
        tokens = kept[step.mini].sum().float()
        counts = torch.cat(
            [torch.stack([tokens, tokens.new_tensor(float(len(step.mini)))]), self._is_weight_sums(full, step.mini)]
        )
        num_tokens, num_sequences, weight_sum, weight_count = self._global_sum(counts)
        is_weight = {"is_weight_mean": weight_sum / weight_count} if weight_count > 0 else {}
        if len(micro) == 0:  # an uneven split left this rank nothing: keep every parameter in the graph
            return sum(p.sum() * 0.0 for p in self.policy.parameters() if p.requires_grad)

        out = self.token_logprobs(self.policy, micro, compute_entropy=True)
        try:
            result = self.loss_fn(
                out.logp,
                micro.completion_mask,
                micro.advantages,
                old_logp=micro.old_logp,
                ref_logp=micro.ref_logp,
                rollout_logp=micro.rollout_logp,
                entropy=out.entropy,
                num_tokens=num_tokens,
                num_sequences=num_sequences,
                **is_weight,
                **({"turn_ids": micro.turn_ids} if micro.turn_ids is not None else {}),
            )
        except NonFiniteError as err:  # rows are micro-batch rows: name the step and micro-batch too
            raise NonFiniteError(f"step {self.trainer.global_step}, micro-batch {int(batch['micro'])}: {err}") from err
        loss = result.loss
        if self.distiller is not None:  # GKD's term and the reverse-KL metric
            loss = loss + self.distiller.training_term(int(batch["micro"]), micro, out.logp, result.metrics)
        self.step_metrics.update(result.metrics, micro.completion_mask.sum())
        # Lightning divides by accumulate_grad_batches and DDP averages over ranks; the loss is
        # already normalised by global counts, so undo both to keep the sum exact.
        return loss * accumulate * self.trainer.world_size

    def validation_step(self, batch: list[dict[str, Any]], batch_idx: int) -> None:
        """Nothing to compute here: the rollout callback scores the dev prompts in its own validation hooks (greedy
        accuracy and mean sampled reward, ``val/*``), since it owns the engine; one error when no callback does."""
        self._check_evaluator("validation")

    def test_step(self, batch: list[dict[str, Any]], batch_idx: int) -> None:
        """The same for the test split (``test/*``; ``lightning-grpo test --ckpt_path ...``)."""
        self._check_evaluator("test")

    def _check_evaluator(self, stage: str) -> None:
        if not any(isinstance(callback, HeldOutEvaluator) for callback in self.trainer.callbacks):
            raise RuntimeError(f"{stage} needs lightning_grpo.RolloutCallback in the Trainer's callbacks")

    def _is_weight_sums(self, full: RolloutBatch, rows: Tensor) -> Tensor:
        """[2] (sum, count) of the loss's IS-weight mean over the optimizer-step batch (zeros: none)."""
        if full.old_logp is None or not self.loss_fn.normalizes_is_weights:
            return torch.zeros(2, device=full.completion_mask.device)
        return self.loss_fn.is_weight_sums(
            full.old_logp[rows], full.rollout_logp[rows], full.completion_mask[rows]
        ).float()

    def _distill_context(self) -> DistillContext:
        """What the distiller uses of this module (lightning_grpo.training.distill): functions read at call time."""
        return DistillContext(
            policy=lambda: self.policy,
            logprobs=lambda *args: self.forward_logprobs(*args),
            global_sum=lambda value: self._global_sum(value),
            precision=lambda: self.precision_context(),
            tokenizer=lambda: self.trainer.datamodule.tokenizer,
            device=lambda: self.device,
            step=lambda: self.trainer.global_step,
            dtype=self.policy_settings.dtype,
            micro_step=lambda rows, i: self.geometry.micro_step(rows, i),
        )

    # -------------------------------------------------------------- optimizer step, guards
    def skip_optimizer_step(self, reason: str) -> None:
        """Drop the gradients of the current optimizer step instead of applying them (guards call
        this). Every rank skips when any rank asks; counted in ``train/skipped_steps``."""
        self._skip_reasons.append(reason)

    def grad_norm(self) -> Tensor:
        """L2 norm of the policy's gradients at this optimizer step (before clipping; NaN / inf if
        any gradient is non-finite). Valid in ``on_before_optimizer_step``."""
        if self._grad_norm is None:
            self._grad_norm = total_grad_norm(self.policy.parameters())
        return self._grad_norm

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Log the step's metrics, then drop its gradients if a guard asked to skip it (optimizers
        leave parameters whose ``grad`` is None untouched: no update, no weight decay, no moments)."""
        metrics = dict(self.step_metrics.compute())
        metrics["grad_norm"] = float(self.grad_norm())
        if self.algorithm.kl_in_reward.coef:  # the coefficient the batch was shaped with, and its measured KL
            metrics["kl_in_reward/coef"], metrics["kl_in_reward/kl"] = self.reward_kl_coef, float(self.reward_kl)
        skip = float(bool(self._skip_reasons))
        if self.trainer.world_size > 1:
            skip = float(self.trainer.strategy.reduce(torch.tensor(skip, device=self.device), reduce_op="sum"))
        if skip:
            for param in self.policy.parameters():
                param.grad = None
            self.skipped_steps += 1
        metrics["skipped_steps"] = float(self.skipped_steps)
        self._log_step(metrics)
        self.step_metrics.reset()
        self._skip_reasons.clear()
        self._grad_norm = None

    def _log_step(self, metrics: dict[str, float]) -> None:
        rollout = (
            reduce_rollout_metrics(self._rollout_metrics) if self.trainer.world_size > 1 else self._rollout_metrics
        )
        if hands_step_metrics_over(self.trainer):
            logged = {f"train/{k}": float(v) for k, v in {**metrics, **rollout}.items()}
            self.log_dict(logged, batch_size=1, on_step=True, on_epoch=False)
        bar = {"reward": float(rollout.get("reward_mean", float("nan")))}
        if "kl" in metrics:
            bar["kl"] = metrics["kl"]
        self.log_dict(bar, prog_bar=True, logger=False, batch_size=1, on_step=True, on_epoch=False)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Also store what ``lightning-grpo export`` needs besides the weights (config, tokenizer files, LoRA)."""
        checkpoint["grpo_skipped_steps"] = self.skipped_steps
        checkpoint["grpo_kl_ctrl"] = self.kl_ctrl.state_dict()
        self._save_export_info(checkpoint)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.skipped_steps = int(checkpoint.get("grpo_skipped_steps", 0))
        if "grpo_kl_ctrl" in checkpoint:
            self.kl_ctrl.load_state_dict(checkpoint["grpo_kl_ctrl"])
        self._load_quant_state(checkpoint)
