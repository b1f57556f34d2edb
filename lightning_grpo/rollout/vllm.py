"""Rollouts with an in-process vLLM engine, refreshed with the policy's weights after each step.

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so weights are pushed
as tensors: :meth:`VLLMEngine.load_weights` copies them into the loaded model (on CPU: copy and
repack, :mod:`~lightning_grpo.rollout.vllm_push`; elsewhere vLLM's ``reload_weights`` RPC,
checkpoint format) and then resets the prefix cache, without which prompts that share more
than one KV block would keep attention keys/values computed by the old weights.

Log-probs are vLLM's ``processed_logprobs``: log-softmax after temperature and after top-k /
top-p truncation (renormalised over the kept tokens). With top-k and top-p off (the defaults)
they equal ``log_softmax(logits / temperature)`` as recomputed by the trainer (within 1e-6 in
float32 on the tiny test model); with truncation on they differ from :class:`~lightning_grpo.rollout.hf.HFEngine`,
which reports the untruncated values.

LoRA, two ways: push merged weights (:func:`~lightning_grpo.models.weights.policy_weights_for_engine`
gives ``W + delta_W``; the default, works everywhere), or build the engine with
``lora.enabled`` (`VLLMLora`) and hand it the adapter saved with ``save_pretrained`` through
:meth:`VLLMEngine.load_lora_adapter`; every later :meth:`~VLLMEngine.generate` then samples
with that adapter on top of the engine's base weights (push those with
``policy_weights_for_engine(model, merge_lora=False)``). vLLM reads the adapter files at the next
``generate``, so keep the directory until then.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterable
from typing import Any

import torch

from lightning_grpo.rollout.base import (
    Rollout,
    RolloutEngine,
    SamplingConfig,
    check_fits,
    request_seed,
    validate_prompts,
)
from lightning_grpo.rollout.engine_defaults import model_config
from lightning_grpo.rollout.engine_settings import ENGINE_ARGS, EngineSettings
from lightning_grpo.rollout.native_stderr import skip_native_lines
from lightning_grpo.rollout.prefill import is_cpu_platform
from lightning_grpo.rollout.vllm_env import (
    export_rank_for_external_launcher,
    keep_default_process_group,
    optional_llm_kwargs,
    preserved_global_rng,
    quiet_known_harmless,
    sleep_kwargs,
)

MISSING_VLLM = "engine='vllm' needs vLLM: pip install 'lightning-grpo[cpu]' (CPU) or 'lightning-grpo[gpu]' (CUDA)"
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
#: ``cpu_gemm="auto"`` uses plain kernels up to this hidden size (measured, docs/evidence/benchmarks.md).
PLAIN_GEMM_MAX_HIDDEN = 128


def import_vllm() -> Any:
    """Import vLLM for in-process use (environment set first); raise a clear ImportError if it is missing."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # same process: weights pushed as tensors
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # with enforce_eager: no 8-20 s compile on first logprobs
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # not an INFO line per weight push
    try:
        import vllm
    except ImportError as err:
        raise ImportError(MISSING_VLLM) from err
    return vllm


class VLLMEngine(RolloutEngine):
    """An in-process vLLM ``LLM`` sampling G completions per prompt from token ids.

    Build it once (in ``setup()``, kept out of the LightningModule's module tree) and push the
    policy's weights with :meth:`load_weights` after every optimizer step. Neither constructing
    the engine nor :meth:`generate` disturbs the global Python / numpy / torch RNG states (vLLM
    reseeds / draws from them; we restore them). Each prompt is one request with ``n=G`` and its
    own seed derived from the ``seed`` given to :meth:`generate`, so the G samples differ, repeated
    prompts get different samples, and the same seed reproduces the rollout.
    """

    needs_weight_sync = True

    def __init__(
        self,
        model_path: str,
        settings: EngineSettings,
        *,
        seed: int = 0,
        owns_model_dir: bool = False,
        sequences: int = 1,
    ) -> None:
        """
        Args:
            model_path: directory of an HF checkpoint (config, weights); its architecture must be one vLLM supports.
            settings: the engine's settings, a :class:`~lightning_grpo.rollout.vllm_args.VLLMArgs` (one docstring per
                field; this module does not import it: the settings build the engine, `VLLMArgs.build`);
                ``max_model_len`` None = the model's ``max_position_embeddings`` (the RolloutCallback sets it
                from the data). Fields left at None follow the device and the model (`VLLMArgs.for_device`).
            seed: vLLM's engine seed (requests are seeded per call anyway).
            owns_model_dir: ``model_path`` is a copy made for this engine (an in-memory policy saved to a
                temporary folder): :meth:`close` removes it.
            sequences: how many sequences one generation samples at once (sizes a CPU KV cache left unset).
        """
        self._owned_dir = str(model_path) if owns_model_dir else None
        args: Any = settings
        if args.dtype is not None and args.dtype not in _DTYPES:
            raise ValueError(f"VLLMEngine dtype must be one of {sorted(_DTYPES)}, got {args.dtype!r}")
        if not os.path.isfile(os.path.join(str(model_path), "config.json")):
            raise FileNotFoundError(
                f"VLLMEngine model_path {model_path!s} has no config.json (expected an HF checkpoint directory)"
            )
        max_model_len = args.max_model_len if args.max_model_len is not None else model_max_length(model_path)
        args = args.for_device(is_cpu_platform(), model_config(model_path), max_model_len, sequences)
        dtype, weight_push, cpu_gemm = args.dtype, args.weight_push.mode, args.weight_push.cpu_gemm
        from lightning_grpo.rollout.sleep import EngineSleep

        self._sleep = EngineSleep(args.sleep_level)  # checks the level before vLLM is imported
        vllm = import_vllm()
        self.dtype = _DTYPES[dtype]
        self.max_model_len = max_model_len
        self.weight_push = weight_push
        self.cpu_gemm = cpu_gemm
        self._inplace_push: Any = None  # the CpuInplacePush plan, built at the first push
        self._plain_kernels = False  # a plain_gemm push switched layers to F.linear
        self._lora_request = None
        self._lora_version = 0
        kwargs: dict[str, Any] = {
            "model": str(model_path),
            "dtype": dtype,
            "max_model_len": max_model_len,
            "seed": seed,
            "enforce_eager": args.enforce_eager,
            "logprobs_mode": "processed_logprobs",
            "skip_tokenizer_init": True,  # prompts and completions stay token ids
            "enable_prefix_caching": True,
            **optional_llm_kwargs(
                args.kv_cache_memory_bytes,
                args.block_size,
                args.lora.enabled,
                args.lora.max_rank,
                args.gpu_memory_utilization,
            ),
            **sleep_kwargs(args.sleep_level),
            **(args.extra_llm_kwargs or {}),  # last: overrides any of the above
        }
        kwargs.update(_scheduler_kwargs(max_model_len, args.max_num_batched_tokens, dict(args.extra_llm_kwargs or {})))
        if kwargs.get("distributed_executor_backend") == "external_launcher":
            export_rank_for_external_launcher()
        # vLLM joins a process group that already exists (a DDP trainer's) instead of creating its
        # own, and its shutdown destroys the default group whoever made it: remember who did.
        self._owns_process_group = not (torch.distributed.is_available() and torch.distributed.is_initialized())
        # vLLM-CPU's NUMA line comes from C++, below logging (on GPU the native lines stay untouched)
        native = skip_native_lines() if not torch.cuda.is_available() else contextlib.nullcontext()
        with quiet_known_harmless(), native, preserved_global_rng():  # LLM(seed=...) reseeds python / numpy / torch
            self._llm = vllm.LLM(**kwargs)

    @property
    def llm(self) -> Any:
        """The underlying ``vllm.LLM`` (for advanced use)."""
        if self._llm is None:
            raise RuntimeError("VLLMEngine is closed")
        return self._llm

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig, seed: int) -> Rollout:
        validate_prompts(prompt_ids)
        check_fits(prompt_ids, sampling.max_new_tokens, self.max_model_len, "engine's", f"{ENGINE_ARGS}.max_model_len")
        from vllm import SamplingParams

        params = [
            SamplingParams(
                n=sampling.n,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k,
                max_tokens=sampling.max_new_tokens,
                stop_token_ids=list(sampling.stop_token_ids or ()),  # kept as the last token, like EOS
                logprobs=0,  # the sampled token's log-prob only
                seed=request_seed(seed, p),  # sample i of the group uses this + i (vLLM)
            )
            for p in range(len(prompt_ids))
        ]
        prompts = [{"prompt_token_ids": list(p)} for p in prompt_ids]
        with quiet_known_harmless():
            self._sleep.before_generate(self.llm)
        with preserved_global_rng():  # vLLM's CPU sampler also draws from the global torch RNG
            outputs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=self._lora_request)
        return self._to_rollout(prompt_ids, outputs, sampling.n)

    def score(self, sequences: list[list[int]]) -> dict[str, list[torch.Tensor]]:
        """Log-probs of ``sequences[i][1:]`` under the engine's weights and adapter: vLLM's prompt log-probs (raw
        logits, before any temperature), one greedy token generated per sequence (so each must be shorter than
        ``max_model_len``)."""
        validate_prompts(sequences)
        check_fits(sequences, 1, self.max_model_len, "engine's", f"{ENGINE_ARGS}.max_model_len")
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        with quiet_known_harmless():
            self._sleep.before_generate(self.llm)
        with preserved_global_rng():
            outputs = self.llm.generate(
                [{"prompt_token_ids": list(s)} for s in sequences],
                params,
                use_tqdm=False,
                lora_request=self._lora_request,
            )
        scores = [
            torch.tensor([rows[t][seq[t]].logprob for t in range(1, len(seq))], dtype=torch.float32)
            for seq, rows in zip(sequences, (out.prompt_logprobs for out in outputs))
        ]
        return {"in-process vLLM": scores}

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int | None = None) -> None:
        """Reload ``(hf_name, tensor)`` pairs in place (cast to the engine dtype), then reset the prefix cache
        (``version`` is not recorded: the engine's samples carry none)."""
        cast = ((name, tensor.detach().to(self.dtype)) for name, tensor in weights)
        with quiet_known_harmless():
            self._sleep.before_push(self.llm)  # the weights only: the KV cache wakes at the next generate
        push = self._push_plan()
        if push is not None:
            push(dict(cast))
            self._plain_kernels = self._plain_kernels or push.plain_gemm
        else:
            if self._plain_kernels:  # reload_weights expects vLLM's packed layout
                from lightning_grpo.rollout.vllm_push import repack_plain_layers

                self.llm.apply_model(repack_plain_layers)
                self._plain_kernels = False
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": cast, "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()
        self._sleep.after_push()

    def sleep(self) -> None:
        """Release the engine's memory as ``sleep_level`` says (no-op at 0) until the next push or generate."""
        with quiet_known_harmless():
            self._sleep.sleep(self.llm)

    @property
    def weights_discarded(self) -> bool:
        """The engine slept at level 2 and needs a push before it can generate."""
        return self._sleep.weights_discarded

    def _push_plan(self) -> Any:
        """The in-place push plan when ``weight_push`` selects it (built once), else None."""
        if self.weight_push == "reload" or self._inplace_push is False:
            return None
        if self._inplace_push is None:
            from lightning_grpo.rollout.vllm_push import plan_cpu_push

            config = self.llm.llm_engine.vllm_config
            tp = config.parallel_config.tensor_parallel_size
            hidden = getattr(config.model_config.hf_config, "hidden_size", None)
            small = hidden is not None and hidden <= PLAIN_GEMM_MAX_HIDDEN
            plain = self.cpu_gemm == "plain" or (self.cpu_gemm == "auto" and small)
            plan = self.llm.apply_model(lambda model: plan_cpu_push(model, tp, plain))[0]
            if plan is None and self.weight_push == "inplace":
                raise ValueError(
                    f"{ENGINE_ARGS}.weight_push.mode: inplace covers CPU engines of dense unquantised models in one "
                    "process (tensor_parallel_size=1); use mode reload or auto for this engine"
                )
            self._inplace_push = plan if plan is not None else False
        return self._inplace_push

    def load_lora_adapter(self, path: str) -> None:
        """Sample with the peft adapter saved (``save_pretrained``) in ``path`` from now on.

        Each call registers the adapter under a fresh id (the previous one is dropped) and resets the
        prefix cache. Needs ``lora.enabled`` (`VLLMLora`). Base weights still come from :meth:`load_weights`.
        """
        if not self.llm.llm_engine.vllm_config.lora_config:
            raise ValueError(
                f"VLLMEngine.load_lora_adapter needs an engine built with {ENGINE_ARGS}.lora.enabled: true"
            )
        if not os.path.isfile(os.path.join(str(path), "adapter_config.json")):
            raise FileNotFoundError(
                f"LoRA adapter dir {path!s} has no adapter_config.json (save the adapter with save_pretrained)"
            )
        from vllm.lora.request import LoRARequest

        previous = self._lora_request
        self._lora_version += 1
        self._lora_request = LoRARequest(f"policy-v{self._lora_version}", self._lora_version, str(path))
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)
        self.llm.reset_prefix_cache()

    def unload_lora_adapter(self) -> None:
        """Stop applying the adapter given to :meth:`load_lora_adapter` (sample with the base weights again)."""
        if self._lora_request is not None:
            self.llm.llm_engine.remove_lora(self._lora_request.lora_int_id)
            self._lora_request = None
            self.llm.reset_prefix_cache()

    def close(self) -> None:
        """Shut the engine down and free its memory, and remove the model folder it owns (the engine is
        unusable afterwards)."""
        try:
            if self._llm is not None:
                with keep_default_process_group(not self._owns_process_group):
                    self._llm.llm_engine.engine_core.shutdown()
        finally:
            self._llm = None
            if self._owned_dir is not None:
                shutil.rmtree(self._owned_dir, ignore_errors=True)
                self._owned_dir = None
            import gc

            gc.collect()

    def _to_rollout(self, prompt_ids: list[list[int]], outputs: list[Any], n: int) -> Rollout:
        completions, logprobs, finished = [], [], []
        for request in outputs:
            for sample in sorted(request.outputs, key=lambda s: s.index):
                ids = list(sample.token_ids)
                completions.append(ids)
                logprobs.append([step[tok].logprob for tok, step in zip(ids, sample.logprobs)])
                finished.append(sample.finish_reason == "stop")
        return Rollout([list(p) for p in prompt_ids], completions, logprobs, finished, group_size=n)


def model_max_length(model_path: str) -> int:
    """The ``max_position_embeddings`` of the checkpoint in ``model_path`` (its ``config.json``)."""
    import json

    with open(os.path.join(str(model_path), "config.json")) as f:
        config = json.load(f)
    length = config.get("max_position_embeddings") or (config.get("text_config") or {}).get("max_position_embeddings")
    if not isinstance(length, int):
        raise ValueError(
            f"VLLMEngine: {model_path}/config.json has no max_position_embeddings: set {ENGINE_ARGS}.max_model_len"
        )
    return length


def _scheduler_kwargs(max_model_len: int, max_num_batched_tokens: int | None, extra: dict[str, Any]) -> dict[str, Any]:
    """Scheduler arguments of ``vllm.LLM``: on CPU chunked prefill off and a budget that holds any
    prompt (:func:`~lightning_grpo.rollout.prefill.cpu_llm_kwargs`); elsewhere only a budget the user set."""
    from lightning_grpo.rollout.prefill import cpu_llm_kwargs, is_cpu_platform

    if is_cpu_platform():
        return cpu_llm_kwargs(max_model_len, max_num_batched_tokens, extra)
    if max_num_batched_tokens is not None and "max_num_batched_tokens" not in extra:
        return {"max_num_batched_tokens": max_num_batched_tokens}
    return {}
