"""On-policy distillation for `GRPOModule`: teachers, the token advantage, GKD.

The student samples (the rollout engine, as for GRPO); a teacher with the same tokenizer scores the
sampled tokens in a no-grad forward, packed like the reference's (``DistillContext.logprobs``),
and the reverse-KL estimate ``k_t = roll_t - teacher_t`` becomes the token advantage
(`opd_advantages`): pure distillation ``A_t = -coef k_t`` (the
rewards are computed and logged but never reach the student) or, with ``use_task_rewards``,
``A_t = A_i - coef k_t``. The usual policy loss trains on it (PPO clip, corrections, ...). Only the
tokens of the completion mask count, so in multi-turn episodes the environment's tokens never do.
``roll`` is the engine's log-prob of the sampled token: the policy that sampled, also under the
asynchronous pipeline (the batch is prepared on the trainer when it is used).

Teachers (``DistillSettings.teacher``): a model directory or hub name (``tiny:chars`` for a built-in
tiny model, initialised from the run's seed; ``tiny:chars@3`` pinned), an ``nn.Module``, ``"base"`` (with LoRA: the policy with its adapter switched off) or
``"adapter:<dir>"`` (with LoRA: a peft adapter loaded next to the policy's own), or a mapping
name -> teacher, one per task: ``teacher_key`` names the record column that picks each row's
teacher (verl ``teacher_key``). A teacher loaded from a path may run in another ``dtype``. Before
training, a path teacher's tokenizer must equal the student's (its vocabulary, ids and eos) and
every teacher's LM head must cover the tokenizer; each failure is one error naming the teacher.

GKD (``gkd_coef > 0``, TRL ``GKDTrainer``): ``gkd_coef`` x the token mean of the generalised JSD
(``beta``) between the student's and the teacher's full next-token distributions, added to the
loss. With probability ``lmbda`` a generation batch's own samples are used (on-policy), otherwise
the records' reference answers (``answer_key``) under their prompts, as TRL mixes student outputs
and dataset outputs. The full logits come from padded forwards (one more student forward).

The distiller sees no training module: it is given a `DistillContext` (plain functions for
the student, its no-grad log-probs, a cross-rank sum, the precision context, the tokenizer, ...),
which ``GRPOModule`` builds and a test can build from plain functions.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

from ..core.batch import MicroStep, RolloutBatch
from ..core.distill import generalized_jsd, group_token_baseline, opd_advantages
from ..core.logprobs import masked_mean
from .packing import padded_completion_logits

TeacherSpec = str | nn.Module
FIELD = "model.distillation"


@dataclass
class DistillSettings:
    """On-policy distillation (and GKD) from one or more teachers (see `lightning_grpo.training.distill`)."""

    teacher: TeacherSpec | dict[str, TeacherSpec] | None = None
    """A model directory / hub name / ``tiny:<variant>``, an ``nn.Module``, ``"base"`` or
    ``"adapter:<dir>"`` (LoRA), or a mapping name -> one of these (several teachers)."""
    teacher_key: str | None = None
    """Record column naming each prompt's teacher (needed with several teachers)."""
    coef: float = 1.0
    """Weight of the reverse-KL advantage: A_t -= coef * (roll_t - teacher_t); 0 = no OPD term."""
    use_task_rewards: bool = False
    """False: pure distillation (the reward advantage is dropped); True: A_t = A_i - coef k_t."""
    group_baseline: bool = False
    """Subtract from -coef k_t the mean of the group's other completions at the same position
    (leave-one-out, a variance reduction the peers' OPD does not have); False: the raw estimate."""
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """dtype of a teacher loaded from a path (None: the policy's ``dtype``)."""
    gkd_coef: float = 0.0
    """Weight of GKD's generalised JSD term (0 = off)."""
    beta: float = 0.5
    """GKD's JSD interpolation (TRL ``beta``): 0 = KL(teacher || student), 1 = KL(student || teacher)."""
    lmbda: float = 1.0
    """GKD: probability that a generation batch uses the student's samples (TRL ``lmbda``)."""
    answer_key: str = "answer"
    """GKD with lmbda < 1: the record column holding the reference completion."""

    def __post_init__(self) -> None:
        if self.teacher is None or (isinstance(self.teacher, dict) and not self.teacher):
            raise ValueError(
                f"{FIELD}.teacher is required: a model path, an nn.Module, 'base', 'adapter:<dir>' or a mapping name -> teacher"
            )
        if isinstance(self.teacher, dict) and len(self.teacher) > 1 and not self.teacher_key:
            raise ValueError(
                f"{FIELD}.teacher_key must name the record column that picks one of the teachers {sorted(self.teacher)}"
            )
        for name, value, ok in (
            ("coef", self.coef, self.coef >= 0),
            ("gkd_coef", self.gkd_coef, self.gkd_coef >= 0),
            ("beta", self.beta, 0 <= self.beta <= 1),
            ("lmbda", self.lmbda, 0 <= self.lmbda <= 1),
        ):
            if not ok:
                raise ValueError(f"{FIELD}.{name} out of range: {value} (coef, gkd_coef >= 0; beta, lmbda in [0, 1])")
        if not (self.coef or self.gkd_coef or self.use_task_rewards):
            raise ValueError(f"{FIELD}: coef = gkd_coef = 0 without use_task_rewards leaves nothing to learn")

    @property
    def named_teachers(self) -> dict[str, TeacherSpec]:
        return dict(self.teacher) if isinstance(self.teacher, dict) else {"default": self.teacher}


@dataclass
class DistillContext:
    """What the distiller uses of training, as plain functions (called when needed, so they see the
    student and trainer of that moment). ``GRPOModule`` builds one; a test can build one by hand."""

    policy: Callable[[], nn.Module]
    """The student (``"base"`` / ``"adapter:"`` teachers are it with its adapter switched)."""
    logprobs: Callable[[nn.Module, RolloutBatch], Tensor]
    """(model, batch) -> [B, Lc] completion log-probs without gradient, computed as
    the reference's (packing, precision, rows per pass)."""
    global_sum: Callable[[Tensor], Tensor]
    """A scalar summed over the ranks (float32, on the student's device)."""
    precision: Callable[[], AbstractContextManager]
    """The trainer's autocast context (training_step's)."""
    tokenizer: Callable[[], Any]
    """The student's tokenizer (GKD's reference answers, lmbda < 1)."""
    device: Callable[[], torch.device]
    """The student's device."""
    step: Callable[[], int]
    """The optimizer step (GKD's per-batch lmbda draw)."""
    micro_step: Callable[[int, int], MicroStep]
    """(rows, micro_index) -> the rows micro-step ``micro_index`` trains (`micro_step`)."""
    dtype: str = "float32"
    """dtype of a teacher loaded from a path when ``DistillSettings.dtype`` is None (the policy's)."""


class Distiller:
    """Builds the teachers, scores each generation batch and adds GKD's term (``GRPOModule.distiller``)."""

    @classmethod
    def of(cls, settings: DistillSettings | dict | None, context: DistillContext) -> Distiller | None:
        """A distiller for ``settings`` (a dict from LightningCLI / hparams is accepted), None for None."""
        if settings is None:
            return None
        return cls(DistillSettings(**settings) if isinstance(settings, dict) else settings, context)

    def __init__(self, settings: DistillSettings, context: DistillContext) -> None:
        self.settings = settings
        self.ctx = context
        self.names = list(settings.named_teachers)
        self._models: dict[str, nn.Module | None] = {}  # None: the policy itself (base / adapter teachers)
        self._adapters: dict[str, str | None] = {}  # peft adapter of a teacher that is the policy (None: adapter off)
        self._gkd: RolloutBatch | None = None
        self._gkd_teachers: Tensor | None = None

    # ----------------------------------------------------------------------------- teachers
    def build(self, tokenizer: Any | None, records: list[dict] | None = None) -> None:
        """Load every teacher (once) and check it against the policy and ``tokenizer``, and that every
        training record names a teacher (``records``, when given); before training."""
        if records and len(self.names) > 1:
            self._teacher_ids(records)
        for name, spec in self.settings.named_teachers.items():
            if name not in self._models:
                self._models[name] = self._load(name, spec)
            where = f"{FIELD}.teacher[{name!r}]" if len(self.names) > 1 else f"{FIELD}.teacher"
            if tokenizer is not None:
                check_teacher(where, spec, self._models[name] or self.ctx.policy(), tokenizer)
            if self.settings.gkd_coef and self._models[name] is not None:  # GKD compares whole distributions
                theirs, ours = (
                    m.get_output_embeddings().weight.shape[0] for m in (self._models[name], self.ctx.policy())
                )
                if theirs != ours:
                    raise ValueError(
                        f"{where}: GKD compares full next-token distributions, but the teacher's LM head has "
                        f"{theirs} rows and the student's {ours}"
                    )

    def _load(self, name: str, spec: TeacherSpec) -> nn.Module | None:
        where = f"{FIELD}.teacher[{name!r}]"
        if isinstance(spec, nn.Module):
            return spec.eval().requires_grad_(False)
        if spec == "base" or spec.startswith("adapter:"):
            if not hasattr(self.ctx.policy(), "disable_adapter"):  # a transformers / peft model (third-party)
                raise ValueError(
                    f"{where} = {spec!r} needs a LoRA policy (model.policy.lora): the teacher is the policy's base model"
                )
            if self.settings.dtype is not None:
                raise ValueError(
                    f"{FIELD}.dtype applies to a teacher loaded from a path, not to {spec!r} (the policy itself)"
                )
            self._adapters[name] = None
            if spec != "base":
                adapter = f"teacher_{name}"
                self.ctx.policy().load_adapter(spec.split(":", 1)[1], adapter_name=adapter, is_trainable=False)
                self._adapters[name] = adapter
            return None
        from transformers import AutoModelForCausalLM

        from ..models.hub import is_local_path
        from ..models.tiny import builtin_model_path

        source = builtin_model_path(spec, where)  # "tiny:chars": the run seed's initialisation, "tiny:chars@3" pinned
        if is_local_path(source) and not Path(source).expanduser().is_dir():
            raise ValueError(
                f"{where} {spec!r}: no model directory there (SavePretrained writes one; a hub name is 'org/name')"
            )
        dtype = getattr(torch, self.settings.dtype or self.ctx.dtype)
        try:
            teacher = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
        except OSError as err:
            raise ValueError(
                f"{where} {spec!r}: no model there ({err.__class__.__name__}: {str(err)[:200]}); give a model "
                "directory (SavePretrained writes one), a hub name, 'base' or 'adapter:<dir>'"
            ) from err
        return teacher.eval().requires_grad_(False)

    @contextmanager
    def _as_teacher(self, name: str):
        """The model that is teacher ``name``, inside the context that makes it one."""
        model = self._models[name]
        if model is not None:
            yield model.to(self.ctx.device())
            return
        policy, adapter = self.ctx.policy(), self._adapters[name]
        if adapter is None:
            with policy.disable_adapter():
                yield policy
            return
        active = policy.active_adapter
        policy.set_adapter(adapter)
        try:
            yield policy
        finally:
            policy.set_adapter(active)  # peft's set_adapter also restores which adapter trains

    def _rows_per_teacher(self, batch: RolloutBatch, records: list[dict] | None) -> Tensor:
        """[B] long: the teacher of each row (records hold one entry per group)."""
        if len(self.names) == 1:
            return torch.zeros(len(batch), dtype=torch.long)
        if records is None:
            raise ValueError(f"{FIELD}: several teachers need the batch's records (RolloutCallback passes them)")
        return self._teacher_ids(records).repeat_interleave(len(batch) // max(len(records), 1))

    def _teacher_ids(self, records: list[dict]) -> Tensor:
        """[len(records)] long: the index of each record's teacher (``teacher_key`` column)."""
        key, ids = self.settings.teacher_key, []
        for record in records:
            if record.get(key) not in self.names:
                raise ValueError(
                    f"{FIELD}.teacher_key {key!r}: a record has {record.get(key)!r}; the teachers are {self.names}"
                )
            ids.append(self.names.index(record[key]))
        return torch.tensor(ids, dtype=torch.long)

    def _teacher_logprobs(self, batch: RolloutBatch, teacher_of: Tensor) -> Tensor:
        out = torch.zeros_like(batch.completion_mask, dtype=torch.float32)  # [B, Lc]
        for i, name in enumerate(self.names):
            rows = (teacher_of == i).nonzero().flatten()
            if rows.numel():
                with self._as_teacher(name) as model:
                    out[rows.to(out.device)] = self.ctx.logprobs(model, batch.select(rows.to(batch.input_ids.device)))
        return out

    # ----------------------------------------------------------------------------- per batch
    def prepare(self, batch: RolloutBatch, records: list[dict] | None) -> RolloutBatch:
        """A new batch: ``batch`` (a fresh generation batch with its reward advantages) with the teachers' log-probs
        and the token advantages."""
        s = self.settings
        teacher_of = self._rows_per_teacher(batch, records)
        teacher_logp = self._teacher_logprobs(batch, teacher_of)  # [B, Lc]
        adv = opd_advantages(batch.rollout_logp, teacher_logp, batch.completion_mask, s.coef)  # [B, Lc]
        if s.group_baseline:
            adv = group_token_baseline(adv, batch.completion_mask, batch.group_size)
        if s.use_task_rewards:
            adv = adv + batch.advantages.unsqueeze(-1) * batch.completion_mask
        batch = replace(batch, teacher_logp=teacher_logp, advantages=adv)
        if s.gkd_coef:
            self._gkd, self._gkd_teachers = batch, teacher_of
            if s.lmbda < 1 and random.Random(_seed(self.ctx.step())).random() >= s.lmbda:
                self._gkd = reference_batch(
                    records, self.ctx.tokenizer(), s.answer_key, batch.temperature, self.ctx.device()
                )
                self._gkd_teachers = teacher_of[:: batch.group_size]
        return batch

    def training_term(self, micro_index: int, micro: RolloutBatch, logp: Tensor, metrics: dict) -> Tensor:
        """Logged reverse KL of the current policy, plus GKD's term for micro-step ``micro_index``."""
        if micro.teacher_logp is not None:
            metrics["distill_reverse_kl"] = masked_mean(
                (logp.detach() - micro.teacher_logp).float(), micro.completion_mask
            )
        if not self.settings.gkd_coef or self._gkd is None:
            return logp.new_zeros(())
        step = self.ctx.micro_step(len(self._gkd), micro_index)
        if step.micro.numel() == 0:  # fewer reference rows than micro-steps: this one has none
            return logp.new_zeros(())
        part = self._gkd.select(step.micro)
        student = padded_completion_logits(self.ctx.policy(), part)  # [b, Lc, V] with gradient
        teacher = torch.zeros_like(student, dtype=torch.float32)
        with torch.no_grad():
            for i, name in enumerate(self.names):
                rows = (self._gkd_teachers[step.micro] == i).nonzero().flatten().to(student.device)
                if rows.numel():
                    with self._as_teacher(name) as model, self.ctx.precision():
                        teacher[rows] = padded_completion_logits(model, part.select(rows)).float()
        jsd = generalized_jsd(student, teacher, self.settings.beta, part.temperature)  # [b, Lc]
        metrics["gkd_jsd"] = masked_mean(jsd.detach(), part.completion_mask)
        tokens = self.ctx.global_sum(self._gkd.completion_mask[step.mini].sum())
        total = (jsd * part.completion_mask).sum()
        return self.settings.gkd_coef * torch.where(tokens > 0, total / tokens.clamp(min=1), total * 0)


def _seed(step: int) -> int:
    """One draw per generation batch: the run seed and the optimizer step that batch starts at."""
    from ..models.tiny import run_seed

    return run_seed() * 1_000_003 + step


def reference_batch(
    records: list[dict] | None, tokenizer: Any, answer_key: str, temperature: float, device
) -> RolloutBatch:
    """One row per record: its prompt and its reference completion (``answer_key``) + eos. GKD's
    off-policy data, as TRL's dataset outputs. Prompts are left-padded, completions right-padded (the
    rollout layout)."""
    if not records or answer_key not in records[0]:
        raise ValueError(
            f"{FIELD}.lmbda < 1 trains on the records' reference completions: column {answer_key!r} (answer_key) is missing"
        )
    prompts = [list(r["prompt_ids"]) for r in records]
    completions = [
        tokenizer(str(r[answer_key]), add_special_tokens=False).input_ids + [tokenizer.eos_token_id] for r in records
    ]
    Lp, Lc = max(map(len, prompts)), max(map(len, completions))
    input_ids = torch.full((len(records), Lp + Lc), tokenizer.pad_token_id, dtype=torch.long)  # [B, Lp+Lc]
    attention_mask = torch.zeros_like(input_ids)  # [B, Lp+Lc]
    for b, (prompt, completion) in enumerate(zip(prompts, completions)):
        input_ids[b, Lp - len(prompt) : Lp + len(completion)] = torch.tensor(prompt + completion, dtype=torch.long)
        attention_mask[b, Lp - len(prompt) : Lp + len(completion)] = 1
    completion_mask = attention_mask[:, Lp:].float()  # [B, Lc]
    return RolloutBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        completion_mask=completion_mask,
        advantages=torch.zeros(len(records)),
        rollout_logp=torch.zeros_like(completion_mask),
        prompt_length=Lp,
        group_size=1,
        temperature=temperature,
    ).to(device)


def check_teacher(where: str, spec: TeacherSpec, teacher: nn.Module, tokenizer: Any) -> None:
    """One clear error when the teacher cannot score the student's token ids: another tokenizer
    (path teachers: vocabulary, ids, eos) or an LM head smaller than the tokenizer."""
    if isinstance(spec, str) and spec != "base" and not spec.startswith("adapter:"):
        from transformers import AutoTokenizer

        from ..models.tiny import builtin_tokenizer_path

        theirs = AutoTokenizer.from_pretrained(builtin_tokenizer_path(spec, where))
        ours_vocab, their_vocab = tokenizer.get_vocab(), theirs.get_vocab()
        differ = sorted(t for t in set(ours_vocab) | set(their_vocab) if ours_vocab.get(t) != their_vocab.get(t))
        if differ or theirs.eos_token_id != tokenizer.eos_token_id:
            example = (
                f"e.g. {differ[0]!r}: {their_vocab.get(differ[0])} vs {ours_vocab.get(differ[0])}"
                if differ
                else "the eos ids differ"
            )
            raise ValueError(
                f"{where} {spec!r} has another tokenizer than the student's ({len(differ)} tokens differ, {example}): "
                "on-policy distillation scores the student's token ids with the teacher, so both must share one tokenizer"
            )
    # a transformers / peft model (third-party)
    head = teacher.get_output_embeddings() if hasattr(teacher, "get_output_embeddings") else None
    # a transformers / peft model (third-party)
    rows = head.weight.shape[0] if head is not None else getattr(getattr(teacher, "config", None), "vocab_size", None)
    if rows is not None and rows < len(tokenizer):
        raise ValueError(
            f"{where}: its LM head has {rows} rows but the tokenizer has {len(tokenizer)} tokens (another vocabulary?)"
        )
