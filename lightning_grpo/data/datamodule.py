"""Prompt data for RL: a data source (files, a ``datasets`` dataset, a hub id or local dataset
folder, or the built-in digit task), mapped, checked and tokenized once.

Every batch is a list of records (``collate = identity``); a record is a dict holding
``"prompt"`` (the text actually fed to the policy, after the chat template), ``"prompt_ids"``
(``list[int]``), ``"raw_prompt"`` (the prompt column before the template), ``"answer"`` (copied
from ``answer_column``) and every other column of the row, so reward functions receive all of
them (:mod:`lightning_grpo.data.records`). Rows come from a
:class:`~lightning_grpo.data.sources.DataSource`.

Training does not iterate records through a DataLoader: which prompts a rank samples at a
generation is a pure function of (seed, generation, rank) (:mod:`lightning_grpo.data.schedule`),
so a resumed run draws exactly what the uninterrupted one would have drawn. The training
"dataloader" yields one tick per training step, ``{"micro": m}``, where m counts the steps fed by
the current generation batch.
"""

from __future__ import annotations

from typing import Any, Iterator, Literal

import lightning as L
from torch.utils.data import DataLoader, IterableDataset

from lightning_grpo.core.batch import BatchGeometry
from lightning_grpo.data.records import (
    RecordFormat, RecordMap, apply_record_map, check_template_kwargs, check_tokenizer, resolve_record_map,
)  # fmt: skip
from lightning_grpo.data.schedule import generation_indices, permutation, refill_indices
from lightning_grpo.data.sources import DataSource, DigitTaskSource, FileSplit, LocalSource, RowsSplit
from lightning_grpo.models.tiny import builtin_tokenizer_path

Rows = tuple[list[dict[str, Any]], str]  # (rows, how errors name them)


def _identity(batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return batch


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

    Sources, one of: ``source`` (a :class:`~lightning_grpo.data.sources.DataSource`, e.g.
    :class:`~lightning_grpo.data.sources.HubDataset`); ``train_files`` / ``train_dataset``
    (validation from ``val_files`` / ``val_dataset``, test from ``test_files`` / ``test_dataset``);
    when none is given, the built-in digit task (:func:`~lightning_grpo.data.tasks.digit_splits`).
    Without a validation split, ``val_fraction`` splits the training rows; otherwise there is none.
    The validation split is the dev split (checked during ``fit``, where settings are chosen); the
    test split is read by ``lightning-grpo test`` only (docs/tuning.md). Guide: docs/data.md.

    Args:
        source: Where the rows come from (``class_path`` / ``init_args`` in a recipe); excludes
            ``train_files``, ``val_files``, ``train_dataset`` and ``val_dataset``.
        train_files: Training file(s): ``.jsonl``, ``.json``, ``.parquet`` or ``.csv`` (read with
            ``datasets.load_dataset``).
        val_files: Validation file(s), same formats.
        train_dataset: A ``datasets.Dataset`` or a list of dicts used instead of ``train_files``.
        val_dataset: A ``datasets.Dataset`` or a list of dicts used instead of ``val_files``.
        test_files: Test file(s), same formats: the split ``lightning-grpo test`` reports, which no
            setting should be chosen on.
        test_dataset: A ``datasets.Dataset`` or a list of dicts used instead of ``test_files``.
        record_map: Import path (``"my_module.fn"`` or ``"my_module:fn"``; the current directory
            is importable from ``lightning-grpo``) or, from Python, the function itself: ``fn(row)
            -> row`` applied to every raw row of every split before the columns are checked (to
            rename, add or derive columns; every column reaches the reward functions by name).
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
        task_num_test: Test prompts of the built-in digit task (none of them a training or
            validation prompt; adding them changes neither of those splits); 0 for none.
        cache_dir: Cache folder of ``datasets.load_dataset``; ``None`` for its default.
        chat_template_kwargs: Extra keyword arguments of the chat template (needs ``use_chat_template``),
            e.g. ``{enable_thinking: false}`` for Qwen3, whose prompt then ends in an empty ``<think>`` block
            (TRL's ``chat_template_kwargs``).
    """

    def __init__(
        self,
        source: DataSource | None = None,
        train_files: str | list[str] | None = None,
        val_files: str | list[str] | None = None,
        train_dataset: Any = None,
        val_dataset: Any = None,
        test_files: str | list[str] | None = None,
        test_dataset: Any = None,
        record_map: str | RecordMap | None = None,
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
        task_num_test: int = 50,
        cache_dir: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        _check_options(dict(locals()))
        super().__init__()
        objects = ["source", "train_dataset", "val_dataset", "test_dataset"] + (["record_map"] if callable(record_map) else [])
        self.save_hyperparameters(ignore=objects)  # what a YAML cannot hold; the CLI saves its own config
        self.source = source if source is not None else _builtin_source(locals())
        self.record_map = resolve_record_map(record_map)
        self.tokenizer_path = builtin_tokenizer_path(tokenizer_path)  # "tiny:tools" -> a built-in tiny model (any seed)
        self.format = RecordFormat(prompt_column, answer_column, use_chat_template, system_prompt, max_prompt_length, on_long_prompt,
                                   chat_template_kwargs)  # fmt: skip
        self.val_fraction, self.seed, self.shuffle = val_fraction, seed, shuffle
        self.batch_size, self.val_batch_size = batch_size, val_batch_size or batch_size
        self._geometry = BatchGeometry(prompts=batch_size)  # one training step per generation until set_geometry
        #: The tokenizer; loaded from ``tokenizer_path`` in :meth:`setup` unless assigned before.
        self.tokenizer: Any = None
        #: Prepared records, filled by :meth:`setup`.
        self.train_records: list[dict[str, Any]] | None = None
        self.val_records: list[dict[str, Any]] = []
        self.test_records: list[dict[str, Any]] = []

    @property
    def max_prompt_length(self) -> int | None:
        return self.format.max_prompt_length

    # ------------------------------------------------------------------------------- setup
    def _load_tokenizer(self) -> Any:
        if self.tokenizer is None:
            from transformers import AutoTokenizer

            if self.tokenizer_path is None:  # the built-in tiny model's tokenizer
                from lightning_grpo.models.tiny import tiny_model_dir

                self.tokenizer_path = str(tiny_model_dir())
            self.tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path)
        where = self.tokenizer_path or type(self.tokenizer).__name__
        check_tokenizer(self.tokenizer, where, self.format.use_chat_template)
        return self.tokenizer

    def _read(self, split: Literal["train", "val", "test"]) -> Rows | None:
        """The source's rows of ``split`` after the mapping hook (None: the source has no such split)."""
        rows = {"train": self.source.train_rows, "val": self.source.val_rows, "test": self.source.test_rows}[split]()
        if rows is None:
            return None
        name = self.source.describe(split)
        return apply_record_map(self.record_map, rows, name), name

    def _split_off_val(self, train: Rows) -> tuple[Rows, Rows]:
        """``val_fraction`` of the training rows (chosen by ``seed``) as the validation split."""
        rows, name = train
        if len(rows) < 2:
            raise ValueError(f"val_fraction needs at least 2 rows, {name} holds {len(rows)}")
        order = permutation(len(rows), self.seed, -1)
        n_val = min(max(1, round(self.val_fraction * len(rows))), len(rows) - 1)
        val_idx = set(order[:n_val])
        return (
            ([r for i, r in enumerate(rows) if i not in val_idx], name),
            ([r for i, r in enumerate(rows) if i in val_idx], f"the validation split of {name}"),
        )

    def _splits(self) -> tuple[Rows, Rows | None]:
        """(train rows, val rows or None), mapped, before checking and tokenizing."""
        train, val = self._read("train"), self._read("val")
        if self.val_fraction is None:
            return train, val
        if val is not None:
            raise ValueError(
                f"val_fraction splits the training rows, but {self.source.describe('train')} comes with a "
                f"validation split ({self.source.describe('val')}): remove one of them"
            )
        return self._split_off_val(train)

    def _train_records(self, train: Rows, tokenizer: Any) -> list[dict[str, Any]]:
        records = self.format.build(*train, tokenizer)
        if len(records) < self.batch_size:
            raise ValueError(f"{train[1]} holds {len(records)} prompts, fewer than batch_size={self.batch_size}")
        return records

    def prepare_data(self) -> None:
        """Load and check the data: Lightning calls this (on local rank 0) before its loggers create
        their run directory, so a bad file or column fails with nothing written; :meth:`setup`
        then finds the data ready here and loads it on the other ranks."""
        self.setup()

    def setup(self, stage: str | None = None) -> None:
        """Load the tokenizer and the data, check them, and tokenize every prompt (once)."""
        if self.train_records is not None:
            return
        tokenizer = self._load_tokenizer()
        train, val = self._splits()
        test = self._read("test")
        for split in (train, val, test):
            if split is not None:
                self.format.check_columns(*split)
        train_records = self._train_records(train, tokenizer)
        self.val_records = self.format.build(*val, tokenizer) if val is not None else []
        self.test_records = self.format.build(*test, tokenizer) if test is not None else []
        self.train_records = train_records

    def refresh_train(self) -> None:
        """Read the source's training rows again and replace :attr:`train_records` (mapping hook,
        column checks, chat template and tokenization applied again; the validation records stay).

        For sources whose rows change over a run (a curriculum): call it at the same step on every
        rank; the prompt schedule follows the new record count (:mod:`lightning_grpo.data.sources`).
        """
        if self.train_records is None:
            raise RuntimeError("PromptDataModule.setup() must run before refresh_train()")
        train = self._read("train")
        if self.val_fraction is not None:
            train = self._split_off_val(train)[0]
        self.format.check_columns(*train)
        self.train_records = self._train_records(train, self._load_tokenizer())

    # ------------------------------------------------------------------------------- loaders
    def _records(self, split: Literal["train", "val", "test"]) -> list[dict[str, Any]]:
        if self.train_records is None:
            raise RuntimeError("PromptDataModule.setup() must run before the data is used")
        return {"train": self.train_records, "val": self.val_records, "test": self.test_records}[split]

    def set_geometry(self, geometry: BatchGeometry) -> None:
        """Use the run's batch geometry (RolloutCallback hands it over before training): each generation
        batch feeds ``geometry.training_steps`` ticks."""
        self._geometry = geometry

    def train_dataloader(self) -> DataLoader:
        """One tick per training step (see the module docstring); an epoch is one pass over the
        training prompts by all ranks together."""
        records = self._records("train")
        world = self.trainer.world_size if self.trainer is not None else 1
        generations = max(1, len(records) // (self.batch_size * world))
        return DataLoader(GenerationTicks(generations, self._geometry.training_steps), batch_size=None)

    def val_dataloader(self) -> DataLoader | list:
        records = self._records("val")
        if not records:
            return []
        return DataLoader(records, batch_size=self.val_batch_size, shuffle=False, collate_fn=_identity)

    def test_dataloader(self) -> DataLoader:
        """The test split in batches of ``val_batch_size`` (``lightning-grpo test``); an error when there is none."""
        records = self._records("test")
        if not records:
            raise ValueError(
                f"lightning-grpo test needs a test split, and {self.source.describe('test')} has none: give data.test_files / "
                "data.test_dataset, data.task_num_test (digit task) or the source's test split (e.g. test_split, test_size)"
            )
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


def _builtin_source(h: dict[str, Any]) -> DataSource:
    """The source that the file / dataset / digit-task options (``h``) describe."""
    splits = []
    for split in ("train", "val", "test"):
        files, data = h[f"{split}_files"], h[f"{split}_dataset"]
        if files is not None:
            splits.append(FileSplit(files, f"{split}_files", h["cache_dir"]))
        else:
            splits.append(RowsSplit(data, f"{split}_dataset") if data is not None else None)
    if splits[0] is not None:
        return LocalSource(*splits)
    return DigitTaskSource(h["task_seed"], h["task_rule"], h["task_num_train"], h["task_num_val"], h["task_num_test"])


def _check_options(h: dict[str, Any]) -> None:
    """Reject contradictory or out-of-range options of :class:`PromptDataModule` (``h``: its arguments)."""
    has_train = h["train_files"] is not None or h["train_dataset"] is not None
    has_val = h["val_files"] is not None or h["val_dataset"] is not None
    has_test = h["test_files"] is not None or h["test_dataset"] is not None
    if h["source"] is not None:
        given = [k for k in ("train_files", "val_files", "train_dataset", "val_dataset", "test_files", "test_dataset") if h[k] is not None]
        if given:
            raise ValueError(
                f"data.source reads the rows, so data.{given[0]} cannot be given too: use either a source or "
                "train_files / train_dataset (with val_files / val_dataset, test_files / test_dataset)"
            )
        if not isinstance(h["source"], DataSource):
            raise TypeError(
                f"data.source must be a lightning_grpo.data.sources.DataSource, got {type(h['source']).__name__}"
            )
    if h["train_files"] is not None and h["train_dataset"] is not None:
        raise ValueError("give train_files or train_dataset, not both")
    if h["val_files"] is not None and h["val_dataset"] is not None:
        raise ValueError("give val_files or val_dataset, not both")
    if h["test_files"] is not None and h["test_dataset"] is not None:
        raise ValueError("give test_files or test_dataset, not both")
    for split, given in (("val", has_val), ("test", has_test)):
        if given and not has_train:
            raise ValueError(f"{split}_files/{split}_dataset need train_files or train_dataset (the digit task has its own splits)")
    if h["val_fraction"] is not None:
        if not 0 < h["val_fraction"] < 1:
            raise ValueError(f"val_fraction must be in (0, 1), got {h['val_fraction']}")
        if has_val or not (has_train or h["source"] is not None):
            raise ValueError(
                "val_fraction splits train_files/train_dataset and cannot be combined with a validation source"
            )
    if h["system_prompt"] is not None and not h["use_chat_template"]:
        raise ValueError("system_prompt needs use_chat_template=True")
    check_template_kwargs(h["chat_template_kwargs"], h["use_chat_template"])
    if h["on_long_prompt"] not in ("error", "truncate"):
        raise ValueError(f"on_long_prompt must be 'error' or 'truncate', got {h['on_long_prompt']!r}")
    for name in ("batch_size", "val_batch_size", "max_prompt_length"):
        value = h[name]
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
