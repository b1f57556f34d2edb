"""Prompt data for RL: files, a ``datasets.Dataset``, or the built-in digit task, tokenized once.

Every batch is a list of records (``collate = identity``); a record is a dict holding
``"prompt"`` (the text actually fed to the policy, after the chat template), ``"prompt_ids"``
(``list[int]``), ``"answer"`` (copied from ``answer_column``) and every other column of the row,
so reward functions receive all of them.

Training does not iterate records through a DataLoader: which prompts a rank samples at a
generation is a pure function of (seed, generation, rank) (:mod:`lightning_grpo.data.schedule`),
so a resumed run draws exactly what the uninterrupted one would have drawn. The training
"dataloader" yields one tick per training step, ``{"micro": m}``, where m counts the steps fed by
the current generation batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Literal, Sequence

import lightning as L
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import DataLoader, IterableDataset

from lightning_grpo.batch import steps_per_batch
from lightning_grpo.data.schedule import generation_indices, permutation, refill_indices
from lightning_grpo.data.tasks import DIGIT_RULES, digit_task
from lightning_grpo.data.tiny import builtin_model_path

#: File suffix -> ``datasets`` builder name.
SUPPORTED_EXTENSIONS: dict[str, str] = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def _identity(batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return batch


def _check_files(files: str | Sequence[str] | None, field: str) -> tuple[str, list[str]] | None:
    """(builder, paths) for ``files``; raises naming ``field`` and the file when one is unusable."""
    if files is None:
        return None
    paths = [files] if isinstance(files, (str, Path)) else list(files)
    if not paths:
        raise ValueError(f"{field} is an empty list; give at least one file")
    builders = set()
    for path in map(str, paths):
        suffix = Path(path).suffix.lower()
        if suffix not in SUPPORTED_EXTENSIONS:
            raise ValueError(
                f"{field}: unsupported file type {suffix or '(none)'!r} for {path}; "
                f"supported: {sorted(SUPPORTED_EXTENSIONS)}"
            )
        if not Path(path).is_file():
            raise FileNotFoundError(f"{field}: file not found: {path}")
        if Path(path).stat().st_size == 0:
            raise ValueError(f"{field}: {path} is empty (holds no rows)")
        builders.add(SUPPORTED_EXTENSIONS[suffix])
    if len(builders) > 1:
        raise ValueError(f"{field} mixes file types {sorted(builders)}; use one type per split")
    return builders.pop(), [str(p) for p in paths]


def _read_files(builder: str, paths: list[str], cache_dir: str | None) -> list[dict[str, Any]]:
    import datasets

    source = paths[0] if len(paths) == 1 else str(paths)
    try:
        data = datasets.load_dataset(builder, data_files=paths, split="train", cache_dir=cache_dir)
    except Exception as err:  # datasets raises many types; name the file
        raise ValueError(f"could not read {source} with datasets.load_dataset({builder!r}): {err}") from err
    return data.to_list()


def _rows(data: Any, field: str) -> list[dict[str, Any]]:
    """Rows of a ``datasets.Dataset`` or a list of dicts."""
    if hasattr(data, "to_list"):
        return data.to_list()
    if isinstance(data, Sequence) and all(isinstance(r, dict) for r in data):
        return [dict(r) for r in data]
    raise TypeError(f"{field} must be a datasets.Dataset or a list of dicts, got {type(data).__name__}")


class GenerationTicks(IterableDataset):
    """``{"micro": m}`` for m = 0 .. steps_per_generation_batch - 1, ``generations`` times."""

    def __init__(self, generations: int, steps_per_generation_batch: int) -> None:
        self.generations, self.steps = generations, steps_per_generation_batch

    def __iter__(self) -> Iterator[dict[str, int]]:
        for _ in range(self.generations):
            for micro in range(self.steps):
                yield {"micro": micro}

    def __len__(self) -> int:
        return self.generations * self.steps


class PromptDataModule(L.LightningDataModule):
    """Prompts for RL training and validation, tokenized with the policy's tokenizer.

    Sources, in order: ``train_files`` / ``train_dataset``; when neither is given, the built-in
    digit task (:func:`~lightning_grpo.data.tasks.digit_task`). Validation comes from
    ``val_files`` / ``val_dataset``, else a ``val_fraction`` split of the training rows, else the
    digit task's held-out split; otherwise there is none.

    Args:
        train_files: Training file(s): ``.jsonl``, ``.json``, ``.parquet`` or ``.csv`` (read with
            ``datasets.load_dataset``).
        val_files: Validation file(s), same formats.
        train_dataset: A ``datasets.Dataset`` or a list of dicts used instead of ``train_files``.
        val_dataset: A ``datasets.Dataset`` or a list of dicts used instead of ``val_files``.
        tokenizer_path: Path or hub id of the policy's tokenizer (loaded in :meth:`setup`);
            ``None``: the built-in tiny model's character tokenizer.
        prompt_column: Column holding the prompt: a string, or a list of chat messages when
            ``use_chat_template`` is true.
        answer_column: Column copied to each record's ``"answer"`` (read by ``exact_match``,
            ``math_accuracy``); ``None`` for data without answers.
        use_chat_template: Wrap each prompt as a user message and apply the tokenizer's chat
            template (with the generation prompt); false feeds the text as it is.
        system_prompt: System message put before each prompt (needs ``use_chat_template``).
        val_fraction: Fraction in (0, 1) of the training rows split off (by ``seed``) as the
            validation set, when no validation source is given.
        batch_size: Prompts per training step (each is sampled several times by the rollout).
        val_batch_size: Prompts per validation batch; defaults to ``batch_size``.
        max_prompt_length: Longest prompt in tokens; ``None`` for no limit.
        on_long_prompt: ``"error"`` on a prompt over ``max_prompt_length``, or ``"truncate"`` it
            to its last ``max_prompt_length`` tokens (warns once).
        seed: Seed of the shuffles and of the ``val_fraction`` split.
        shuffle: Shuffle the training prompts (per epoch, by ``seed``).
        task_seed: Seed of the built-in digit task.
        task_rule: Answer rule of the built-in digit task (``"last_plus_one"``, ``"last_digit"``,
            ``"first_digit"``, or ``"count_to_last"`` with answers of 1-10 characters).
        task_num_train: Training prompts of the built-in digit task.
        task_num_val: Validation prompts of the built-in digit task.
        cache_dir: Cache folder of ``datasets.load_dataset``; ``None`` for its default.
    """

    def __init__(
        self,
        train_files: str | list[str] | None = None,
        val_files: str | list[str] | None = None,
        train_dataset: Any = None,
        val_dataset: Any = None,
        tokenizer_path: str | None = None,
        prompt_column: str = "prompt",
        answer_column: str | None = "answer",
        use_chat_template: bool = False,
        system_prompt: str | None = None,
        val_fraction: float | None = None,
        batch_size: int = 8,
        val_batch_size: int | None = None,
        max_prompt_length: int | None = None,
        on_long_prompt: Literal["error", "truncate"] = "error",
        seed: int = 0,
        shuffle: bool = True,
        task_seed: int = 0,
        task_rule: str = "last_plus_one",
        task_num_train: int = 300,
        task_num_val: int = 50,
        cache_dir: str | None = None,
    ) -> None:
        _check_options(dict(locals()))
        super().__init__()
        self.save_hyperparameters(ignore=["train_dataset", "val_dataset"])
        self._train_files = _check_files(train_files, "train_files")
        self._val_files = _check_files(val_files, "val_files")
        self.train_dataset, self.val_dataset = train_dataset, val_dataset
        self.tokenizer_path = builtin_model_path(tokenizer_path)  # "tiny:tools" -> a built-in tiny model
        self.prompt_column, self.answer_column = prompt_column, answer_column
        self.use_chat_template, self.system_prompt = use_chat_template, system_prompt
        self.val_fraction, self.seed, self.shuffle = val_fraction, seed, shuffle
        self.batch_size, self.val_batch_size = batch_size, val_batch_size or batch_size
        self.max_prompt_length, self.on_long_prompt = max_prompt_length, on_long_prompt
        self.task = {"seed": task_seed, "rule": task_rule, "num_train": task_num_train, "num_val": task_num_val}
        self.cache_dir = cache_dir
        #: The tokenizer; loaded from ``tokenizer_path`` in :meth:`setup` unless assigned before.
        self.tokenizer: Any = None
        #: Prepared records, filled by :meth:`setup`.
        self.train_records: list[dict[str, Any]] | None = None
        self.val_records: list[dict[str, Any]] = []
        self._warned_truncation = False

    # ------------------------------------------------------------------------------- setup
    def _load_tokenizer(self) -> Any:
        if self.tokenizer is None:
            from transformers import AutoTokenizer

            if self.tokenizer_path is None:  # the built-in tiny model's tokenizer
                from lightning_grpo.data.tiny import tiny_model_dir

                self.tokenizer_path = str(tiny_model_dir())
            self.tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path)
        _check_tokenizer(self.tokenizer, self.tokenizer_path or type(self.tokenizer).__name__, self.use_chat_template)
        return self.tokenizer

    def _raw_splits(self) -> tuple[tuple[list[dict], str], tuple[list[dict], str] | None]:
        """((train rows, source name), (val rows, source name) or None), before tokenizing."""
        if self._train_files is not None:
            train = (_read_files(*self._train_files, self.cache_dir), _source(self._train_files[1], "train_files"))
        elif self.train_dataset is not None:
            train = (_rows(self.train_dataset, "train_dataset"), "train_dataset")
        else:
            rows, val_rows = digit_task(**self.task)
            return (rows, "the digit task's training split"), (val_rows, "the digit task's validation split")
        if self._val_files is not None:
            return train, (_read_files(*self._val_files, self.cache_dir), _source(self._val_files[1], "val_files"))
        if self.val_dataset is not None:
            return train, (_rows(self.val_dataset, "val_dataset"), "val_dataset")
        if self.val_fraction is None:
            return train, None
        rows, source = train
        if len(rows) < 2:
            raise ValueError(f"val_fraction needs at least 2 rows, {source} holds {len(rows)}")
        order = permutation(len(rows), self.seed, -1)
        n_val = min(max(1, round(self.val_fraction * len(rows))), len(rows) - 1)
        val_idx = set(order[:n_val])
        return (
            ([r for i, r in enumerate(rows) if i not in val_idx], source),
            ([r for i, r in enumerate(rows) if i in val_idx], f"the validation split of {source}"),
        )

    def prepare_data(self) -> None:
        """Load and check the data, then the whole run's options (:mod:`lightning_grpo.validation`).

        Lightning calls this (on local rank 0) before its loggers create their run directory, so
        a bad option or file fails with nothing written; :meth:`setup` then finds the data ready
        here and loads it on the other ranks.
        """
        self.setup()
        trainer = self.trainer
        if trainer is None or trainer.lightning_module is None:
            return
        from lightning_grpo.callbacks.rollout import RolloutCallback
        from lightning_grpo.validation import check_fit_config

        for callback in trainer.callbacks:
            if isinstance(callback, RolloutCallback):
                check_fit_config(trainer, trainer.lightning_module, callback)

    def setup(self, stage: str | None = None) -> None:
        """Load the tokenizer and the data, check them, and tokenize every prompt (once)."""
        if self.train_records is not None:
            return
        tokenizer = self._load_tokenizer()
        (train_rows, train_source), val = self._raw_splits()
        self._check_columns(train_rows, train_source)
        if val is not None:
            self._check_columns(*val)
        train = self._prepare(train_rows, train_source, tokenizer)
        if len(train) < self.batch_size:
            raise ValueError(f"{train_source} holds {len(train)} prompts, fewer than batch_size={self.batch_size}")
        self.val_records = self._prepare(*val, tokenizer) if val is not None else []
        self.train_records = train

    def _check_columns(self, rows: list[dict[str, Any]], source: str) -> None:
        if not rows:
            raise ValueError(f"{source} holds no rows")
        present = list(rows[0])
        if self.prompt_column not in present:
            raise ValueError(f"prompt_column {self.prompt_column!r} not found in {source}; columns present: {present}")
        if self.answer_column is not None and self.answer_column not in present:
            raise ValueError(
                f"answer_column {self.answer_column!r} not found in {source}; columns present: {present} "
                "(set answer_column=None for data without answers)"
            )

    def _render(self, prompt: Any, tokenizer: Any, source: str, index: int) -> str:
        """The text fed to the policy for one prompt value."""
        is_chat = isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt)
        if not isinstance(prompt, str) and not is_chat:
            raise ValueError(
                f"prompt_column {self.prompt_column!r} of {source} must hold strings or chat messages; "
                f"row {index} holds a {type(prompt).__name__}"
            )
        if not self.use_chat_template:
            if is_chat:
                raise ValueError(
                    f"prompt_column {self.prompt_column!r} of {source} holds chat messages; set use_chat_template=True"
                )
            return prompt
        messages = list(prompt) if is_chat else [{"role": "user", "content": prompt}]
        if self.system_prompt is not None and not (messages and messages[0].get("role") == "system"):
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def _prepare(self, rows: list[dict[str, Any]], source: str, tokenizer: Any) -> list[dict[str, Any]]:
        """Records with the rendered ``prompt``, its ``prompt_ids`` and the ``answer``."""
        texts = [self._render(row[self.prompt_column], tokenizer, source, i) for i, row in enumerate(rows)]
        # A chat template writes its own special tokens (e.g. BOS); plain text gets the tokenizer's.
        all_ids = tokenizer(texts, add_special_tokens=not self.use_chat_template)["input_ids"]
        limit, truncated = self.max_prompt_length, 0
        records = []
        for i, (row, text, ids) in enumerate(zip(rows, texts, all_ids)):
            if limit is not None and len(ids) > limit:
                if self.on_long_prompt == "error":
                    raise ValueError(
                        f"prompt {i} of {source} has {len(ids)} tokens, more than max_prompt_length={limit} "
                        f"(set on_long_prompt='truncate' to keep its last {limit} tokens)"
                    )
                ids, truncated = ids[-limit:], truncated + 1
                text = tokenizer.decode(ids, skip_special_tokens=False)
            record = {**row, "prompt": text, "prompt_ids": list(ids)}
            if self.answer_column is not None:
                record["answer"] = row[self.answer_column]
            records.append(record)
        if truncated and not self._warned_truncation:
            self._warned_truncation = True
            rank_zero_warn(
                f"truncated {truncated} of {len(rows)} prompts of {source} to their last {limit} tokens "
                "(max_prompt_length); further truncations are not reported"
            )
        return records

    # ------------------------------------------------------------------------------- loaders
    def _records(self, split: Literal["train", "val"]) -> list[dict[str, Any]]:
        if self.train_records is None:
            raise RuntimeError("PromptDataModule.setup() must run before the data is used")
        return self.train_records if split == "train" else self.val_records

    def train_dataloader(self) -> DataLoader:
        """One tick per training step (see the module docstring); an epoch is one pass over the
        training prompts by all ranks together."""
        records = self._records("train")
        trainer = self.trainer
        module = trainer.lightning_module if trainer is not None else None
        world = trainer.world_size if trainer is not None else 1
        per_generation = steps_per_batch(
            getattr(module.hparams, "num_iterations", 1) if module is not None else 1,
            getattr(module.hparams, "steps_per_generation", 1) if module is not None else 1,
            trainer.accumulate_grad_batches if trainer is not None else 1,
        )
        generations = max(1, len(records) // (self.batch_size * world))
        return DataLoader(GenerationTicks(generations, per_generation), batch_size=None)

    def val_dataloader(self) -> DataLoader | list:
        records = self._records("val")
        if not records:
            return []
        return DataLoader(records, batch_size=self.val_batch_size, shuffle=False, collate_fn=_identity)

    def generation_prompts(
        self, generation: int, rank: int = 0, world_size: int = 1, round_: int = 0, max_rounds: int = 1
    ) -> list[dict[str, Any]]:
        """The ``batch_size`` training records of ``generation`` on ``rank``; rounds > 0 are
        dynamic-sampling refills, drawn from a separate sequence."""
        records = self._records("train")
        n, p = len(records), self.batch_size
        if round_ == 0:
            idx = generation_indices(n, p, generation, self.seed, rank, world_size, self.shuffle)
        else:
            idx = refill_indices(n, p, generation, round_, max_rounds, self.seed, rank, world_size, self.shuffle)
        return [records[i] for i in idx]


def _check_tokenizer(tokenizer: Any, where: str, use_chat_template: bool) -> None:
    """An EOS token (completions must be able to end), a pad token (the EOS one when it has none),
    and a chat template when ``use_chat_template`` asks for one."""
    if getattr(tokenizer, "eos_token_id", None) is None:
        raise ValueError(
            f"the tokenizer at {where} (data.tokenizer_path) has no EOS token, so no completion could end: "
            "use the policy's own tokenizer, or set its eos_token"
        )
    if getattr(tokenizer, "pad_token_id", None) is None:
        tokenizer.pad_token = tokenizer.eos_token  # padding is masked out everywhere
    if use_chat_template and not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"use_chat_template=True but the tokenizer at {where} has no chat template: set "
            "data.use_chat_template: false to feed the prompts as plain text, or point data.tokenizer_path "
            "at a tokenizer that has one (an instruct / chat model's)"
        )


def _source(paths: list[str], field: str) -> str:
    return f"{field} {paths[0]}" if len(paths) == 1 else f"{field} {paths}"


def _check_options(h: dict[str, Any]) -> None:
    """Reject contradictory or out-of-range options of :class:`PromptDataModule` (``h``: its arguments)."""
    has_train = h["train_files"] is not None or h["train_dataset"] is not None
    has_val = h["val_files"] is not None or h["val_dataset"] is not None
    if h["train_files"] is not None and h["train_dataset"] is not None:
        raise ValueError("give train_files or train_dataset, not both")
    if h["val_files"] is not None and h["val_dataset"] is not None:
        raise ValueError("give val_files or val_dataset, not both")
    if has_val and not has_train:
        raise ValueError("val_files/val_dataset need train_files or train_dataset (the digit task has its own split)")
    if h["val_fraction"] is not None:
        if not 0 < h["val_fraction"] < 1:
            raise ValueError(f"val_fraction must be in (0, 1), got {h['val_fraction']}")
        if has_val or not has_train:
            raise ValueError(
                "val_fraction splits train_files/train_dataset and cannot be combined with a validation source"
            )
    if h["system_prompt"] is not None and not h["use_chat_template"]:
        raise ValueError("system_prompt needs use_chat_template=True")
    if h["on_long_prompt"] not in ("error", "truncate"):
        raise ValueError(f"on_long_prompt must be 'error' or 'truncate', got {h['on_long_prompt']!r}")
    for name in ("batch_size", "val_batch_size", "max_prompt_length"):
        value = h[name]
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if not has_train:
        DIGIT_RULES.get(h["task_rule"])
