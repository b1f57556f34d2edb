"""``reward_model``: a sequence-classification model (a trained reward model) as a reward.

Each (prompt, completion) pair is rendered with the reward model's OWN tokenizer and chat
template (``[*prompt messages, {"role": "assistant", "content": completion}]``; a text prompt
becomes one user message), tokenized, right- or left-padded as its tokenizer is configured, and
scored in batches of ``batch_size`` by ``AutoModelForSequenceClassification``. The score is the
classifier's pooled logit (transformers pools the last token that is not padding):

- ``num_labels == 1`` (the usual reward model, e.g. trained with a Bradley-Terry loss): the logit;
- ``num_labels > 1`` (a classifier): the logit of ``label`` (an index or a name in ``id2label``),
  after ``activation`` (``"softmax"`` gives that class's probability).

The options are checked, and the config and tokenizer read, when the set is built (before
training); the weights load once, at the first batch, on ``device`` in ``dtype``, frozen, outside
the policy's module tree (nothing is trained, checkpointed or wrapped by DDP / FSDP). Under DDP
every rank loads its own copy and scores its own rows; nothing is gathered (groups never span ranks).
"""

from __future__ import annotations

import inspect
import threading
from typing import Any, Literal

import torch

from lightning_grpo.data.options import check_bool, check_choice, check_int, fail, is_int, prompt_column
from lightning_grpo.data.registry import REWARDS, RewardError

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: ``activation``: applied to the ``[b, num_labels]`` logits before the ``label`` column is taken.
ACTIVATIONS = {"none": lambda x: x, "sigmoid": torch.sigmoid, "softmax": lambda x: x.softmax(-1)}


def resolve_device(device: str) -> torch.device:
    """``"auto"``: the current CUDA device (the rank's, under DDP) if there is one, else the CPU."""
    if device == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    return torch.device(device)


def _check_device(device: Any) -> None:
    if device == "auto":
        return
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        fail("device", "'auto', 'cpu', 'cuda' or 'cuda:<index>'", device)
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"kwargs.device is {device!r} but CUDA is not available here (use 'auto' or 'cpu')")


def _load_config(model: Any):
    if not isinstance(model, str) or not model:
        fail("model", "the path of a sequence-classification model directory", model)
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model)
    except (OSError, ValueError) as err:
        raise ValueError(f"kwargs.model {model!r} is not a model directory with a config.json: {err}") from None
    architectures = list(getattr(config, "architectures", None) or [])  # a transformers config (third-party)
    if architectures and not any(a.endswith("ForSequenceClassification") for a in architectures):
        raise ValueError(
            f"kwargs.model {model!r} is a {architectures[0]} checkpoint, not a sequence classifier "
            "(its score head would be random); save an AutoModelForSequenceClassification"
        )
    return config


def _label_index(config: Any, label: Any, activation: Any) -> int:
    check_choice("activation", activation, list(ACTIVATIONS))
    n = int(config.num_labels)
    if n == 1:
        if label not in (None, 0):
            fail("label", "null or 0 for a model with num_labels 1", label)
        if activation == "softmax":
            raise ValueError("kwargs.activation 'softmax' over one label is always 1; use 'none' or 'sigmoid'")
        return 0
    if label is None:
        raise ValueError(
            f"kwargs.label is needed: the model has num_labels {n} ({dict(config.id2label)}); "
            "name the class whose logit (or probability, with activation 'softmax') is the reward"
        )
    if isinstance(label, str):
        if label not in config.label2id:
            fail("label", f"an index in [0, {n}) or one of {sorted(config.label2id)}", label)
        return int(config.label2id[label])
    if not is_int(label) or not 0 <= label < n:
        fail("label", f"an index in [0, {n}) or one of {sorted(config.label2id)}", label)
    return label


@REWARDS.register("reward_model")
class RewardModel:
    """A sequence-classification reward model (options are the ``kwargs`` of its ``RewardSpec``).

    Args:
        model: directory of an ``AutoModelForSequenceClassification`` checkpoint (``save_pretrained``).
        tokenizer: its tokenizer directory; default ``model``.
        batch_size: rows per forward pass.
        dtype: ``"auto"`` (bfloat16 on CUDA, float32 elsewhere), ``"float32"``, ``"bfloat16"``, ``"float16"``.
        device: ``"auto"`` (the rank's CUDA device, else CPU), ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...
        prompt_column: the column holding each prompt, text or a list of chat messages; default
            ``raw_prompt`` (the data's prompt before the policy's chat template) when the records
            carry it, else ``prompt``.
        chat_template: render with the tokenizer's chat template; false scores ``prompt + completion``
            as plain text (the tokenizer then adds its own special tokens).
        max_length: longest input in tokens; longer inputs keep their last ``max_length`` tokens
            (the scored last token stays). None: no limit.
        label: with ``num_labels > 1``, the class (index or ``id2label`` name) whose logit is the reward.
        activation: ``"none"`` (the logit), ``"sigmoid"`` or ``"softmax"`` (over the labels) first.
    """

    def __init__(
        self,
        model: str,
        tokenizer: str | None = None,
        batch_size: int = 16,
        dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto",
        device: str = "auto",
        prompt_column: str | None = None,
        chat_template: bool = True,
        max_length: int | None = None,
        label: int | str | None = None,
        activation: Literal["none", "sigmoid", "softmax"] = "none",
    ) -> None:
        config = _load_config(model)
        self.label = _label_index(config, label, activation)
        check_int("batch_size", batch_size, 1)
        check_choice("dtype", dtype, ["auto", *_DTYPES])
        _check_device(device)
        if prompt_column is not None and (not isinstance(prompt_column, str) or not prompt_column):
            fail("prompt_column", "a column name or null", prompt_column)
        check_bool("chat_template", chat_template)
        check_int("max_length", max_length, 1, optional=True)
        self.path, self.batch_size, self.dtype, self.device = model, batch_size, dtype, device
        self.prompt_column, self.chat_template, self.max_length, self.activation = (
            prompt_column,
            chat_template,
            max_length,
            activation,
        )
        self.tokenizer = self._load_tokenizer(tokenizer if tokenizer is not None else model)
        self._model: torch.nn.Module | None = None
        self._lock = threading.Lock()

    def _load_tokenizer(self, source: Any):
        if not isinstance(source, str) or not source:
            fail("tokenizer", "a tokenizer directory or null (the model's)", source)
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(source)
        except (OSError, ValueError) as err:
            raise ValueError(f"kwargs.tokenizer: cannot load a tokenizer from {source!r}: {err}") from None
        if self.chat_template and not tokenizer.chat_template:
            raise ValueError(
                f"the reward model's tokenizer {source!r} has no chat template; set kwargs.chat_template: false "
                "to score prompt + completion as plain text"
            )
        if tokenizer.pad_token_id is None:
            if tokenizer.eos_token_id is None:
                raise ValueError(
                    f"the reward model's tokenizer {source!r} has neither a pad nor an eos token to pad with"
                )
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.truncation_side = "left"  # keep the end: the classifier scores the last token
        return tokenizer

    # ------------------------------------------------------------------- loading
    @property
    def model(self) -> torch.nn.Module:
        """The classifier, loaded on first use (once; thread-safe)."""
        with self._lock:
            if self._model is None:
                self._model = self._load_model()
        return self._model

    def _load_model(self) -> torch.nn.Module:
        from transformers import AutoModelForSequenceClassification

        device = resolve_device(self.device)
        dtype = _DTYPES.get(self.dtype) or (torch.bfloat16 if device.type == "cuda" else torch.float32)
        model = AutoModelForSequenceClassification.from_pretrained(self.path, dtype=dtype)
        if model.config.pad_token_id is None:  # batches need it: transformers pools the last non-pad token
            model.config.pad_token_id = self.tokenizer.pad_token_id
        self._takes_positions = "position_ids" in inspect.signature(model.forward).parameters
        return model.to(device).eval().requires_grad_(False)

    # ------------------------------------------------------------------- scoring
    def texts(self, completions: list[str], prompts: list[Any]) -> list[str]:
        """The text each pair is scored as (the reward model's chat template, or plain text)."""
        out = []
        for i, (prompt, completion) in enumerate(zip(prompts, completions)):
            is_chat = isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt)
            if not self.chat_template:
                if not isinstance(prompt, str):
                    raise RewardError(f"chat_template is false but prompt {i} is a {type(prompt).__name__}, not text")
                out.append(prompt + completion)
                continue
            if not isinstance(prompt, str) and not is_chat:
                raise RewardError(f"prompt {i} is a {type(prompt).__name__}; expected text or a list of chat messages")
            messages = list(prompt) if is_chat else [{"role": "user", "content": prompt}]
            out.append(
                self.tokenizer.apply_chat_template(
                    [*messages, {"role": "assistant", "content": completion}], tokenize=False
                )
            )
        return out

    def __call__(self, completions: list[str], **columns: Any) -> list[float]:
        column = prompt_column(columns, self.prompt_column)
        if column is None:
            raise RewardError(
                f"prompt_column {self.prompt_column or 'prompt'!r} is not a column of the data; "
                f"columns: {sorted(columns)}"
            )
        texts = self.texts(completions, list(columns[column]))
        limit = {"truncation": True, "max_length": self.max_length} if self.max_length else {}
        ids = [self.tokenizer(t, add_special_tokens=not self.chat_template, **limit)["input_ids"] for t in texts]
        empty = [i for i, row in enumerate(ids) if not row]
        if empty:
            raise RewardError(f"sample {empty[0]} has no tokens to score")
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))  # similar lengths together: less padding
        scores = [0.0] * len(ids)
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]
            for i, value in zip(rows, self.score_ids([ids[i] for i in rows]).tolist()):
                scores[i] = value
        return scores

    @torch.inference_mode()
    def score_ids(self, ids: list[list[int]]) -> torch.Tensor:
        """``[b]`` float32 rewards of token-id rows (padded on the tokenizer's ``padding_side``)."""
        model = self.model
        device = next(model.parameters()).device
        width, left = max(map(len, ids)), self.tokenizer.padding_side == "left"
        padded = [
            [0] * (width - len(row)) + [1] * len(row) if left else [1] * len(row) + [0] * (width - len(row))
            for row in ids
        ]
        mask = torch.tensor(padded, device=device)  # [b, T] 1 on tokens, 0 on padding
        input_ids = torch.full(mask.shape, self.tokenizer.pad_token_id, dtype=torch.long, device=device)  # [b, T]
        input_ids[mask.bool()] = torch.tensor([t for row in ids for t in row], device=device)
        inputs = {"input_ids": input_ids, "attention_mask": mask}
        if self._takes_positions:  # left padding: each row's positions start at 0, as unpadded
            inputs["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)  # [b, T]
        logits = model(**inputs).logits
        return ACTIVATIONS[self.activation](logits.float())[:, self.label].cpu()  # [b, num_labels] -> [b]

    def __getstate__(self) -> dict[str, Any]:  # picklable (ddp_spawn): weights reload in the child
        return {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_model")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.Lock(), _model=None)
