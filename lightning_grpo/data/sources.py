"""Where `PromptDataModule` reads its rows from.

A `DataSource` hands over raw rows (``dict`` per row, column name -> value); the data module
then applies the record-mapping hook (``data.format.record_map``), checks the columns, renders the
prompts (chat template) and tokenizes them (`lightning_grpo.data.records`). Built in:

* `HubDataset`: anything ``datasets.load_dataset`` reads (a hub id, a local folder of
  ``.jsonl`` / ``.json`` / ``.parquet`` / ``.csv`` files, a builder name with ``data_files``),
  and folders written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``;
* `Files`: data files per split (``data.train_files`` / ``data.val_files`` /
  ``data.test_files`` are its short form, with the default cache);
* `Rows`: rows in memory per split (a ``datasets.Dataset`` or a list of dicts);
* `DigitTask`: the built-in digit task, generated from a seed.

In a recipe::

    data:
      source:
        class_path: lightning_grpo.data.sources.HubDataset
        init_args: {path: ./my_dataset_folder, train_split: train, val_split: validation, test_split: test}

The contract for a new source (e.g. a procedural task generator):

* `DataSource.train_rows` returns the training rows; `DataSource.val_rows` the
  validation (dev) rows or ``None`` (then ``data.val_fraction`` may split the training rows);
  `DataSource.test_rows` the test rows or ``None`` (read by ``lightning-grpo test`` only:
  the split no setting is chosen on, docs/evidence/tuning.md). Test rows must be none of the training or
  validation rows.
  Both must return the **same rows on every rank** (seed any randomness, never read a clock):
  every rank prepares its own copy and the prompt schedule indexes into it.
* `DataSource.describe` names a split in error messages (``"HubDataset ./data split 'train'"``).
* Raise in ``__init__`` for bad options (name the field, ``data.source.<arg>``) so a recipe fails
  before any work; raise from the ``*_rows`` methods for what only reading can tell.
* `PromptDataModule.refresh_train() <lightning_grpo.data.datamodule.PromptDataModule.refresh_train>`
  calls `DataSource.train_rows` again and replaces the training records (mapping hook,
  checks, template and tokenization applied again), e.g. from a curriculum callback after it
  raised the difficulty. It must run at the same training step on every rank. The prompt
  schedule (`lightning_grpo.data.schedule`) is a pure function of (seed, generation, rank,
  number of records), so it keeps working when the count changes; a source whose rows change over
  a run must restore that state itself (its callback's ``state_dict``) for an exact resume.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from lightning_grpo.models.hub import is_local_path

from .files import SUPPORTED_EXTENSIONS, TEXT_BUILDERS, check_files, check_utf8, json_error, read_files

Split = Literal["train", "val", "test"]


class DataSource(ABC):
    """Raw rows for `PromptDataModule` (see the module docstring)."""

    @abstractmethod
    def train_rows(self) -> list[dict[str, Any]]:
        """The training rows, the same on every rank."""

    def val_rows(self) -> list[dict[str, Any]] | None:
        """The validation rows, or ``None`` when this source has no validation split."""
        return None

    def test_rows(self) -> list[dict[str, Any]] | None:
        """The test rows (``lightning-grpo test``), or ``None`` when this source has no test split."""
        return None

    def describe(self, split: Split) -> str:
        """How error messages name ``split`` of this source."""
        return f"{type(self).__name__} split {split!r}"


# ------------------------------------------------------------------------------- in memory
def dataset_rows(data: Any, field: str) -> list[dict[str, Any]]:
    """Rows of a ``datasets.Dataset`` or a list of dicts."""
    if hasattr(data, "to_list"):  # a Hugging Face datasets object (third-party)
        return data.to_list()
    if isinstance(data, Sequence) and all(isinstance(r, dict) for r in data):
        return [dict(r) for r in data]
    raise TypeError(f"{field} must be a datasets.Dataset or a list of dicts, got {type(data).__name__}")


class _FileSplit:
    """One split read from data files."""

    def __init__(self, files: str | list[str], field: str, cache_dir: str | None = None) -> None:
        self.builder, self.paths = check_files(files, field)
        self.cache_dir, self.field = cache_dir, field
        self.name = f"{field} {self.paths[0]}" if len(self.paths) == 1 else f"{field} {self.paths}"

    def rows(self) -> list[dict[str, Any]]:
        return read_files(self.builder, self.paths, self.cache_dir, self.field)


class _RowsSplit:
    """One split given in memory."""

    def __init__(self, data: Any, field: str) -> None:
        self.data, self.name = data, field

    def rows(self) -> list[dict[str, Any]]:
        return dataset_rows(self.data, self.name)


class _SplitSource(DataSource):
    """A source whose splits are given one by one (train required, val / test optional)."""

    def __init__(self, parts: dict[Split, _FileSplit | _RowsSplit | None]) -> None:
        self._parts = parts

    def train_rows(self) -> list[dict[str, Any]]:
        return self._parts["train"].rows()

    def val_rows(self) -> list[dict[str, Any]] | None:
        return self._parts["val"].rows() if self._parts["val"] is not None else None

    def test_rows(self) -> list[dict[str, Any]] | None:
        return self._parts["test"].rows() if self._parts["test"] is not None else None

    def describe(self, split: Split) -> str:
        part = self._parts[split]
        return part.name if part is not None else f"(no {split} split)"


class Files(_SplitSource):
    """Data files: ``.jsonl``, ``.json``, ``.parquet`` or ``.csv`` (read with ``datasets.load_dataset``).

    ``data.train_files`` / ``data.val_files`` / ``data.test_files`` are the short way to write this
    source with the default cache.

    Args:
        train: Training file(s).
        val: Validation (dev) file(s), same formats; ``None`` for none (then ``data.val_fraction`` may
            split the training rows).
        test: Test file(s), same formats: the split ``lightning-grpo test`` reports, which no setting
            should be chosen on; ``None`` for none.
        cache_dir: Cache folder of ``datasets.load_dataset``; ``None`` for its default.
    """

    #: How errors name each split's files (as a recipe writes them).
    FIELDS: dict[Split, str] = {"train": "data.source.train", "val": "data.source.val", "test": "data.source.test"}

    def __init__(
        self,
        train: str | list[str],
        val: str | list[str] | None = None,
        test: str | list[str] | None = None,
        cache_dir: str | None = None,
    ) -> None:
        if train is None:
            raise ValueError(f"{self.FIELDS['train']} must name the training file(s), got None")
        given = {"train": train, "val": val, "test": test}
        super().__init__(
            {s: _FileSplit(f, self.FIELDS[s], cache_dir) if f is not None else None for s, f in given.items()}
        )


class FileShortcut(Files):
    """`Files` as ``data.train_files`` / ``data.val_files`` / ``data.test_files`` give it (errors name those keys)."""

    FIELDS: dict[Split, str] = {"train": "data.train_files", "val": "data.val_files", "test": "data.test_files"}


class Rows(_SplitSource):
    """Rows in memory: each split a ``datasets.Dataset`` or a list of dicts (column name -> value).

    Args:
        train: The training rows.
        val: The validation (dev) rows; ``None`` for none (then ``data.val_fraction`` may split the
            training rows).
        test: The test rows (``lightning-grpo test`` only); ``None`` for none.
    """

    def __init__(self, train: Any, val: Any = None, test: Any = None) -> None:
        if train is None:
            raise ValueError(
                "data.source.train must hold the training rows (a datasets.Dataset or a list of dicts), got None"
            )
        given = {"train": train, "val": val, "test": test}
        for split, data in given.items():
            if data is not None and not hasattr(data, "to_list"):  # a Hugging Face datasets object (third-party)
                dataset_rows(data, f"data.source.{split}")  # a wrong type fails here, before any work
        super().__init__({s: _RowsSplit(d, f"data.source.{s}") if d is not None else None for s, d in given.items()})


# -------------------------------------------------------------------------------- datasets
def is_saved_dataset(path: Path) -> bool:
    """A folder written by ``Dataset.save_to_disk`` (``state.json``) or ``DatasetDict.save_to_disk``
    (``dataset_dict.json``), read with ``datasets.load_from_disk``."""
    return path.is_dir() and ((path / "dataset_dict.json").is_file() or (path / "state.json").is_file())


class HubDataset(DataSource):
    """A dataset read with ``datasets.load_dataset`` (a hub id or a local folder), or a folder
    written by ``save_to_disk`` (read with ``datasets.load_from_disk``).

    Args:
        path: Hub id (``"openai/gsm8k"``), local folder of ``.jsonl`` / ``.json`` / ``.parquet`` /
            ``.csv`` files (split names from the file names, e.g. ``train.jsonl``, ``test.jsonl``),
            a builder name with ``data_files`` (``"json"``), or a ``save_to_disk`` folder (one saved
            ``Dataset`` is the split ``"train"``).
        name: The dataset's configuration (``"main"`` for gsm8k); ``None`` for its default.
        train_split: Split the training prompts come from.
        val_split: Split the validation (dev) prompts come from; ``None`` for none (then
            ``data.val_fraction`` may split the training rows).
        test_split: Split the test prompts come from (``lightning-grpo test`` only); ``None`` for none.
        revision: Git revision of a hub dataset (branch, tag or commit).
        data_files: Files of each split, as ``datasets.load_dataset`` takes them (a path, a list,
            or ``{split: path(s)}``); relative to ``path`` when it is a folder.
        cache_dir: Cache folder of ``datasets``; ``None`` for its default.

    Example:
        ```python
        from lightning_grpo import HubDataset, PromptDataModule, PromptFormat

        data = PromptDataModule(
            source=HubDataset("openai/gsm8k", name="main", val_split="test"),
            format=PromptFormat(prompt_column="question"),
            tokenizer_path="Qwen/Qwen2.5-0.5B-Instruct",
        )
        ```
    """

    def __init__(
        self,
        path: str,
        name: str | None = None,
        train_split: str = "train",
        val_split: str | None = None,
        test_split: str | None = None,
        revision: str | None = None,
        data_files: str | list[str] | dict[str, str | list[str]] | None = None,
        cache_dir: str | None = None,
    ) -> None:
        if not isinstance(path, str) or not path:
            raise ValueError(f"data.source.path must be a hub id or a local folder, got {path!r}")
        local = Path(path).expanduser()
        if is_local_path(path) and not local.exists():
            raise FileNotFoundError(f"data.source.path: no such folder or file: {path}")
        if not train_split:
            raise ValueError("data.source.train_split must name a split, got an empty value")
        self.saved = is_saved_dataset(local)
        if self.saved:
            given = [
                f for f, v in (("name", name), ("revision", revision), ("data_files", data_files)) if v is not None
            ]
            if given:
                raise ValueError(
                    f"data.source.{given[0]} is for datasets.load_dataset, but {path} is a folder written by "
                    "save_to_disk (read with datasets.load_from_disk, which has no configurations, revisions "
                    f"or data files): remove data.source.{given[0]}"
                )
        self.path, self.name, self.revision, self.data_files, self.cache_dir = (
            path,
            name,
            revision,
            data_files,
            cache_dir,
        )
        self._load_path = str(local) if local.exists() else path  # "~/data" expanded for datasets
        self.train_split, self.val_split, self.test_split = train_split, val_split, test_split
        if test_split is not None and test_split in (train_split, val_split):
            raise ValueError(
                f"data.source.test_split {test_split!r} is also the train or val split: the test split must be a split of its own"
            )
        self._saved_splits: dict[str, Any] | None = None

    def train_rows(self) -> list[dict[str, Any]]:
        return self._split_rows(self.train_split, "train_split")

    def val_rows(self) -> list[dict[str, Any]] | None:
        return self._split_rows(self.val_split, "val_split") if self.val_split is not None else None

    def test_rows(self) -> list[dict[str, Any]] | None:
        return self._split_rows(self.test_split, "test_split") if self.test_split is not None else None

    def describe(self, split: Split) -> str:
        name = {"train": self.train_split, "val": self.val_split, "test": self.test_split}[split]
        config = f" ({self.name})" if self.name else ""
        return f"HubDataset {self.path}{config} split {name!r}"

    def _split_rows(self, split: str, field: str) -> list[dict[str, Any]]:
        splits = self._load_saved() if self.saved else None
        if splits is not None:
            if split not in splits:
                raise ValueError(self._unknown_split(field, split, sorted(splits)))
            return splits[split].to_list()
        return self._load_split(split, field).to_list()

    def _load_saved(self) -> dict[str, Any]:
        if self._saved_splits is None:
            import datasets

            try:
                data = datasets.load_from_disk(str(Path(self.path).expanduser()))
            except Exception as err:  # datasets raises many types; name the folder
                raise ValueError(
                    f"data.source.path: could not read {self.path} with datasets.load_from_disk: {err}"
                ) from err
            self._saved_splits = dict(data) if isinstance(data, datasets.DatasetDict) else {"train": data}
        return self._saved_splits

    def _load_split(self, split: str, field: str) -> Any:
        import datasets

        local = Path(self._load_path)
        files: list[Path] = []
        if local.is_dir() and self.data_files is None:  # a folder of data files: name the one that is not UTF-8
            suffixes = {s for s, builder in SUPPORTED_EXTENSIONS.items() if builder in TEXT_BUILDERS}
            files = sorted(p for p in local.rglob("*") if p.suffix.lower() in suffixes and p.is_file())
            for path in files:
                check_utf8(str(path), "data.source.path")
        try:
            return datasets.load_dataset(
                self._load_path,
                self.name,
                split=split,
                revision=self.revision,
                data_files=self.data_files,
                cache_dir=self.cache_dir,
            )
        except ValueError as err:
            if str(err).startswith("Unknown split"):
                raise ValueError(self._unknown_split(field, split, self._split_names())) from err
            raise ValueError(self._load_error(split, err, files)) from err
        except Exception as err:  # datasets raises many types; name the source
            raise ValueError(self._load_error(split, err, files)) from err

    def _split_names(self) -> list[str] | str:
        import datasets

        try:
            return datasets.get_dataset_split_names(
                self._load_path, self.name, data_files=self.data_files, revision=self.revision, cache_dir=self.cache_dir
            )
        except Exception:  # noqa: BLE001 - only used to enrich an error message
            return "(could not be listed)"

    def _unknown_split(self, field: str, split: str, present: list[str] | str) -> str:
        return f"data.source.{field} {split!r} not found in {self.path}; its splits: {present}"

    def _load_error(self, split: str, err: Exception, files: list[Path]) -> str:
        located = next((m for m in (json_error(str(p)) for p in files) if m), None)  # the broken JSON line, if any
        if located is not None:
            return f"data.source.path: {located}"
        config = f", name={self.name!r}" if self.name else ""
        field = "data.source.name" if "BuilderConfig" in str(err) else "data.source"
        return (
            f"{field}: could not load {self.path!r}{config} split {split!r} with datasets.load_dataset: "
            f"{type(err).__name__}: {err}"
        )
