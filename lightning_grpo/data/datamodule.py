"""Prompt data for RL: a data source (files, rows in memory, a hub id or local dataset folder, or
the built-in digit task), mapped, checked and tokenized once.

Every batch is a list of records (``collate = identity``); a record is a dict holding
``"prompt"`` (the text actually fed to the policy, after the chat template), ``"prompt_ids"``
(``list[int]``), ``"raw_prompt"`` (the prompt column before the template), ``"answer"`` (copied
from ``data.format.answer_column``) and every other column of the row, so reward functions receive all of
them (`lightning_grpo.data.records`). Rows come from a
`DataSource`.

Training does not iterate records through a DataLoader: which prompts a rank samples at a
generation is a pure function of (seed, generation, rank) (`lightning_grpo.data.schedule`),
so a resumed run draws exactly what the uninterrupted one would have drawn. The training
"dataloader" yields one tick per training step, ``{"micro": m}``, where m counts the steps fed by
the current generation batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Literal

import lightning as L
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader, IterableDataset

from lightning_grpo.core.batch import BatchGeometry
from lightning_grpo.data.records import (
    PromptFormat,
    RecordBuilder,
    apply_record_map,
    check_tokenizer,
    resolve_record_map,
)
from lightning_grpo.data.schedule import generation_indices, permutation, refill_indices
from lightning_grpo.data.sources import DataSource, FileShortcut
from lightning_grpo.models.sources import local_source_problem
from lightning_grpo.models.tiny import builtin_tokenizer_path, run_seed

if TYPE_CHECKING:
    from lightning_grpo.data.sft_format import SFTFormat

NamedRows = tuple[list[dict[str, Any]], str]  # (rows, how errors name them)


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

    The rows come from ``source`` (a `DataSource`:
    `DigitTask`, `Files`,
    `Rows`, `HubDataset`, ...)
    or, as a shortcut, from ``train_files`` (with ``val_files``, ``test_files``). Without a validation
    split, ``val_fraction`` splits the training rows; otherwise there is none. The validation split is
    the dev split (checked during ``fit``, where settings are chosen); the test split is read by
    ``lightning-grpo test`` only (docs/evidence/tuning.md). ``format`` says how rows become prompts. Guide:
    docs/guide/data.md.

    Args:
        source: Where the rows come from (``class_path`` / ``init_args`` in a recipe, e.g.
            ``{class_path: lightning_grpo.DigitTask}`` for the built-in digit task); excludes
            ``train_files``, ``val_files`` and ``test_files``.
        train_files: Training file(s): ``.jsonl``, ``.json``, ``.parquet`` or ``.csv`` (read with
            ``datasets.load_dataset``; `Files` with the default cache).
        val_files: Validation file(s), same formats.
        test_files: Test file(s), same formats: the split ``lightning-grpo test`` reports, which no
            setting should be chosen on.
        tokenizer_path: Path or hub id of the tokenizer (loaded in `setup`); ``None`` (the default): the
            policy's own (its model folder's), which is what a run wants unless the policy was given as an
            ``nn.Module``. A tokenizer that does not belong to the policy is refused before any work.
        format: How rows become prompts: columns, mapping hook, chat template, length limit
            (`PromptFormat`).
        batch_size: Prompts per training step (each is sampled several times by the rollout).
        val_batch_size: Prompts per validation batch; defaults to ``batch_size``.
        val_fraction: Fraction in (0, 1) of the training rows split off (by the order seed) as the
            validation set, when the source has no validation split.
        shuffle: Shuffle the training prompts (per epoch, by the order seed).
        seed: Seed of the shuffles and of the ``val_fraction`` split (`order_seed`); None (the default): the run
            seed (``seed_everything``), so another run seed also draws another prompt order (the published seed
            tables pin 0: every seed there varies the initialisation and the sampling only).

    Example:
        ```python
        from lightning_grpo import PromptDataModule

        data = PromptDataModule(
            train_files="train.jsonl",  # one {"prompt": ..., "answer": ...} per line
            val_files="dev.jsonl",
            tokenizer_path="Qwen/Qwen2.5-0.5B-Instruct",
            batch_size=16,
        )
        ```
    """

    def __init__(
        self,
        source: DataSource | None = None,
        *,
        train_files: str | list[str] | None = None,
        val_files: str | list[str] | None = None,
        test_files: str | list[str] | None = None,
        tokenizer_path: str | None = None,
        format: PromptFormat = PromptFormat(),  # noqa: B008 - a settings value shown by --help, read and never mutated
        batch_size: int = 8,
        val_batch_size: int | None = None,
        val_fraction: float | None = None,
        shuffle: bool = True,
        seed: int | None = None,
    ) -> None:
        _check_options(source, train_files, val_files, test_files, format, batch_size, val_batch_size, val_fraction)
        if not isinstance(shuffle, bool):
            raise ValueError(f"data.shuffle must be true or false, got {shuffle!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"data.seed must be an integer or null (the run seed), got {seed!r}")
        super().__init__()
        # objects stay out of the checkpoint (it is read with weights_only=True; the CLI saves its own config)
        self.save_hyperparameters(ignore=["source", "format"])
        if not callable(format.record_map):
            self.hparams["format"] = asdict(format)  # plain values
        self.source = source if source is not None else FileShortcut(train_files, val_files, test_files)
        self.format = format
        self._record_map = resolve_record_map(format.record_map)
        self._builder: RecordBuilder | SFTFormat = RecordBuilder(format)
        self.tokenizer_path = builtin_tokenizer_path(tokenizer_path)  # "tiny:tools" -> a built-in tiny model (any seed)
        self.val_fraction, self.seed, self.shuffle = val_fraction, seed, shuffle
        self.batch_size, self.val_batch_size = batch_size, val_batch_size or batch_size
        self._geometry: BatchGeometry | None = None  # the run plan's (set_geometry); None: one step per generation
        #: The tokenizer; loaded from `tokenizer_source` in `setup` unless assigned before.
        self.tokenizer: Any = None
        self._policy_tokenizer: str | None = None  # the policy's tokenizer source (use_policy_tokenizer)
        #: Prepared records, filled by `setup`.
        self.train_records: list[dict[str, Any]] | None = None
        self.val_records: list[dict[str, Any]] = []
        self.test_records: list[dict[str, Any]] = []

    @property
    def order_seed(self) -> int:
        """The seed of the prompt order and the ``val_fraction`` split: ``data.seed`` when set, else the run seed
        (:func:`~lightning_grpo.models.tiny.run_seed`, read when the data is set up)."""
        return self.seed if self.seed is not None else run_seed()

    @property
    def max_prompt_length(self) -> int | None:
        """The prompt length limit in tokens (``data.format.max_prompt_length``); None for none."""
        return self.format.max_prompt_length

    # ------------------------------------------------------------------------------- setup
    def use_policy_tokenizer(self, source: str | None) -> None:
        """Take the policy's tokenizer source (``GRPOModule.tokenizer_source``: its model folder or hub id), read
        when ``tokenizer_path`` is unset. The command line hands it over when it builds the run; without a call,
        `setup` reads it from the module the Trainer fits."""
        self._policy_tokenizer = source

    @property
    def tokenizer_source(self) -> str | None:
        """Where the tokenizer is read from: ``tokenizer_path``, else the policy's (None until known)."""
        return self.tokenizer_path or self._policy_tokenizer

    def _policy_tokenizer_source(self) -> str:
        """The policy's tokenizer source: handed over (`use_policy_tokenizer`), else the fitted module's."""
        if self._policy_tokenizer is None and self.trainer is not None:
            module = self.trainer.lightning_module
            self._policy_tokenizer = getattr(module, "tokenizer_source", None)  # a user's module may have none
        if self._policy_tokenizer is None:
            raise ValueError(
                "data.tokenizer_path is not set and the policy's own tokenizer is not known (a policy given as an "
                "nn.Module, or data set up without a module): set data.tokenizer_path to the policy's tokenizer"
            )
        if (problem := local_source_problem(self._policy_tokenizer)) is not None:
            raise FileNotFoundError(f"model.model: {problem}")  # the tokenizer is read before the model
        return self._policy_tokenizer

    def _load_tokenizer(self) -> Any:
        if self.tokenizer is None:
            from transformers import AutoTokenizer

            source = self.tokenizer_path or self._policy_tokenizer_source()
            try:
                self.tokenizer = AutoTokenizer.from_pretrained(source)
            except OSError as err:  # a hub id not cached and not reachable, a folder without tokenizer files
                field = "data.tokenizer_path" if self.tokenizer_path else "model.model (its tokenizer)"
                first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                raise FileNotFoundError(f"{field}: no tokenizer could be loaded from {source}: {first}") from None
        where = self.tokenizer_source or type(self.tokenizer).__name__
        check_tokenizer(self.tokenizer, where, self.format.use_chat_template)
        return self.tokenizer

    def _read(self, split: Literal["train", "val", "test"]) -> NamedRows | None:
        """The source's rows of ``split`` after the mapping hook (None: the source has no such split)."""
        rows = {"train": self.source.train_rows, "val": self.source.val_rows, "test": self.source.test_rows}[split]()
        if rows is None:
            return None
        name = self.source.describe(split)
        return apply_record_map(self._record_map, rows, name), name

    def _split_off_val(self, train: NamedRows) -> tuple[NamedRows, NamedRows]:
        """``val_fraction`` of the training rows (chosen by ``seed``) as the validation split."""
        rows, name = train
        if len(rows) < 2:
            raise ValueError(f"data.val_fraction needs at least 2 rows, {name} holds {len(rows)}")
        order = permutation(len(rows), self.order_seed, -1)
        n_val = min(max(1, round(self.val_fraction * len(rows))), len(rows) - 1)
        val_idx = set(order[:n_val])
        return (
            ([r for i, r in enumerate(rows) if i not in val_idx], name),
            ([r for i, r in enumerate(rows) if i in val_idx], f"the validation split of {name}"),
        )

    def _splits(self) -> tuple[NamedRows, NamedRows | None]:
        """(train rows, val rows or None), mapped, before checking and tokenizing."""
        train, val = self._read("train"), self._read("val")
        if self.val_fraction is None:
            return train, val
        if val is not None:
            raise ValueError(
                f"data.val_fraction splits the training rows, but {self.source.describe('train')} comes with a "
                f"validation split ({self.source.describe('val')}): remove one of them"
            )
        return self._split_off_val(train)

    def _train_records(self, train: NamedRows, tokenizer: Any) -> list[dict[str, Any]]:
        records = self._builder.build(*train, tokenizer)
        if len(records) < self.batch_size:
            raise ValueError(f"{train[1]} holds {len(records)} prompts, fewer than data.batch_size={self.batch_size}")
        return records

    def prepare_data(self) -> None:
        """Load and check the data: Lightning calls this (on local rank 0) before its loggers create
        their run directory, so a bad file or column fails with nothing written; `setup`
        then finds the data ready here and loads it on the other ranks."""
        self.setup()

    def setup(self, stage: str | None = None) -> None:
        """Read the data and check its columns, load the tokenizer, and tokenize every prompt (once)."""
        if self.train_records is not None:
            return
        train, val = self._splits()
        test = self._read("test")
        for split in (train, val, test):
            if split is not None:
                self._builder.check_columns(*split)
        tokenizer = self._load_tokenizer()
        train_records = self._train_records(train, tokenizer)
        if val is None and stage in (None, "fit"):
            rank_zero_info(
                f"{train[1]} comes without validation rows: no validation runs and no val/* metrics (held-out "
                "accuracy) are logged; give them with data.val_files (or the source's validation split), or hold "
                "out some training rows with data.val_fraction"
            )
        self.val_records = self._builder.build(*val, tokenizer) if val is not None else []
        self.test_records = self._builder.build(*test, tokenizer) if test is not None else []
        self.train_records = train_records

    def refresh_train(self) -> None:
        """Read the source's training rows again and replace `train_records` (mapping hook,
        column checks, chat template and tokenization applied again; the validation records stay).

        For sources whose rows change over a run (a curriculum): call it at the same step on every
        rank; the prompt schedule follows the new record count (`lightning_grpo.data.sources`).
        """
        if self.train_records is None:
            raise RuntimeError("PromptDataModule.setup() must run before refresh_train()")
        train = self._read("train")
        if self.val_fraction is not None:
            train = self._split_off_val(train)[0]
        self._builder.check_columns(*train)
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
        steps = 1 if self._geometry is None else self._geometry.training_steps
        return DataLoader(GenerationTicks(generations, steps), batch_size=None)

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
                f"lightning-grpo test needs a test split, and {self.source.describe('test')} has none: give data.test_files, "
                "data.source.test (Files, Rows), data.source.num_test (DigitTask) or the source's test split (e.g. test_split, test_size)"
            )
        return DataLoader(records, batch_size=self.val_batch_size, shuffle=False, collate_fn=_identity)

    def generation_prompts(
        self, generation: int, rank: int = 0, world_size: int = 1, round_: int = 0, max_rounds: int = 1
    ) -> list[dict[str, Any]]:
        """The ``batch_size`` training records of ``generation`` on ``rank``; rounds > 0 are
        dynamic-sampling refills, drawn from a separate sequence."""
        records = self._records("train")
        n, p, seed = len(records), self.batch_size, self.order_seed
        if round_ == 0:
            idx = generation_indices(n, p, generation, seed, rank, world_size, self.shuffle)
        else:
            idx = refill_indices(n, p, generation, round_, max_rounds, seed, rank, world_size, self.shuffle)
        return [records[i] for i in idx]


#: The error for a data module given no data.
NO_DATA = (
    "no data: set data.source (e.g. {class_path: lightning_grpo.DigitTask} for the built-in digit task, or "
    "lightning_grpo.data.sources.HubDataset, Files, Rows) or data.train_files"
)


def _check_options(
    source: Any,
    train_files: Any,
    val_files: Any,
    test_files: Any,
    format: Any,
    batch_size: Any,
    val_batch_size: Any,
    val_fraction: Any,
) -> None:
    """Reject missing, contradictory or out-of-range options of `PromptDataModule`."""
    files = {"train_files": train_files, "val_files": val_files, "test_files": test_files}
    if source is not None:
        given = [k for k, v in files.items() if v is not None]
        if given:
            raise ValueError(
                f"data.source reads the rows, so data.{given[0]} cannot be given too: use either a source or "
                "train_files (with val_files, test_files); over a recipe's source, add --data.source null"
            )
        if not isinstance(source, DataSource):
            raise TypeError(
                f"data.source must be a lightning_grpo.data.sources.DataSource, got {type(source).__name__}"
            )
    elif train_files is None:
        given = [k for k, v in files.items() if v is not None]
        raise ValueError(f"data.{given[0]} needs data.train_files" if given else NO_DATA)
    if not isinstance(format, PromptFormat):
        raise TypeError(f"data.format must be a lightning_grpo.PromptFormat, got {type(format).__name__}")
    if val_fraction is not None:
        if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float)) or not 0 < val_fraction < 1:
            raise ValueError(f"data.val_fraction must be in (0, 1), got {val_fraction!r}")
        if val_files is not None:
            raise ValueError("data.val_fraction splits the training rows and cannot be combined with data.val_files")
    for name, value in (("batch_size", batch_size), ("val_batch_size", val_batch_size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"data.{name} must be a positive integer, got {value!r}")
