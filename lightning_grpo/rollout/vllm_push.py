"""A fast weight push for an in-process vLLM engine on CPU: copy, then repack.

vLLM's ``reload_weights`` is general (any model, quantisation, tensor parallelism) but spends
most of a tiny model's push in Python machinery: it rebuilds every layer's parameters, runs the
checkpoint loader, then re-processes every layer. On CPU the linear layers of a dense,
unquantised model hold their weight only as a oneDNN-packed copy (``layer.cpu_linear``; the
``weight`` parameter is emptied after packing), so an in-place copy into ``weight`` cannot work
either. :class:`CpuInplacePush` does the minimum instead: for each linear layer it stacks the
HF tensors vLLM fuses (``packed_modules_mapping``, e.g. ``q_proj, k_proj, v_proj -> qkv_proj``)
into a new weight and re-runs vLLM's CPU GEMM dispatch (``dispatch_cpu_unquantized_gemm``) on it;
embeddings, norms and biases are copied in place. The plan (which vLLM module takes which HF
tensors) is built once from the loaded model.

Measured on the quickstart model (docs/evidence/benchmarks.md): about 3x faster than ``reload_weights``
with the same log-probs afterwards. :func:`plan_cpu_push` returns None (the engine then uses
``reload_weights``) for anything it does not cover: a non-CPU platform, tensor parallelism,
quantised layers, or a parameter no rule maps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass
class _Linear:
    module: nn.Module
    sources: list[str]  # HF module names whose weights are stacked along dim 0, in order
    has_bias: bool


@dataclass
class _Embedding:
    module: nn.Module
    source: str  # HF module name; vLLM pads the vocabulary, so only the first rows are copied


@dataclass
class _Param:
    param: torch.Tensor
    source: str  # HF parameter name


class CpuInplacePush:
    """Copies HF-named tensors into a loaded vLLM model and refreshes its CPU GEMM weights.

    ``plain_gemm=False`` keeps vLLM's oneDNN-packed kernels and repacks every linear layer at each
    push. ``plain_gemm=True`` switches the layers to ``torch.nn.functional.linear`` on their plain
    weights at the first push; later pushes are then in-place copies. Plain kernels generate
    faster for very small layers (hidden 64: the quickstart) and slower from hidden 256 on
    (docs/evidence/benchmarks.md).
    """

    def __init__(
        self, linears: list[_Linear], embeddings: list[_Embedding], params: list[_Param], plain_gemm: bool = False
    ) -> None:
        self.linears = linears
        self.embeddings = embeddings
        self.params = params
        self.plain_gemm = plain_gemm
        self.required = sorted(
            {f"{s}.weight" for lin in linears for s in lin.sources}
            | {f"{s}.bias" for lin in linears if lin.has_bias for s in lin.sources}
            | {f"{e.source}.weight" for e in embeddings}
            | {p.source for p in params}
        )

    @torch.no_grad()
    def __call__(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Load ``weights`` (HF names -> tensors already in the engine dtype) into the model."""
        missing = [name for name in self.required if name not in weights]
        if missing:
            raise KeyError(f"weight push is missing {len(missing)} tensor(s) the vLLM model needs: {missing[:8]}")
        for lin in self.linears:
            self._load_linear(lin, weights)
        for emb in self.embeddings:
            source = weights[f"{emb.source}.weight"]  # [V, H]; the engine's is [V_padded, H]
            emb.module.weight.data[: source.shape[0]].copy_(source)
            self._refresh_gemm(emb.module, remove_weight=False)
        for other in self.params:  # norms, unfused biases, ...
            other.param.data.copy_(weights[other.source])

    def _load_linear(self, lin: _Linear, weights: Mapping[str, torch.Tensor]) -> None:
        parts = [weights[f"{s}.weight"] for s in lin.sources]
        stacked = (sum(p.shape[0] for p in parts), parts[0].shape[1])  # [sum(N_i), K]
        if self.plain_gemm and tuple(lin.module.weight.shape) == stacked:  # plain kernels since an earlier push
            torch.cat(parts, out=lin.module.weight.data)
        else:
            lin.module.weight = nn.Parameter(torch.cat(parts), requires_grad=False)  # [sum(N_i), K]
        if lin.has_bias:
            lin.module.bias.data.copy_(torch.cat([weights[f"{s}.bias"] for s in lin.sources]))
        self._refresh_gemm(lin.module, remove_weight=True)

    def _refresh_gemm(self, module: nn.Module, remove_weight: bool) -> None:
        if self.plain_gemm:
            module.cpu_linear = torch.nn.functional.linear  # vLLM calls cpu_linear(x, module.weight, bias)
            return
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        dispatch_cpu_unquantized_gemm(module, remove_weight=remove_weight)


def repack_plain_layers(model: nn.Module) -> None:
    """Put vLLM's packed kernels back on layers a ``plain_gemm`` push switched to plain ones (vLLM's
    ``reload_weights`` expects the packed layout: emptied linear weights)."""
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    for module in model.modules():
        if getattr(module, "cpu_linear", None) is not torch.nn.functional.linear:
            continue
        if isinstance(module, LinearBase) and module.weight.numel() > 0:
            dispatch_cpu_unquantized_gemm(module, remove_weight=True)
        elif isinstance(module, VocabParallelEmbedding):
            dispatch_cpu_unquantized_gemm(module, remove_weight=False)


def plan_cpu_push(model: nn.Module, tensor_parallel_size: int = 1, plain_gemm: bool = False) -> CpuInplacePush | None:
    """Map every parameter of vLLM ``model`` to the HF tensors it is loaded from, or None if any is not covered."""
    from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or tensor_parallel_size != 1:
        return None
    packed: dict[str, list[str]] = dict(getattr(model, "packed_modules_mapping", {}) or {})
    linears, embeddings, params = [], [], []
    covered: set[int] = set()
    for name, module in model.named_modules():
        hf_name = name.removesuffix(".base_layer")  # vLLM's LoRA wrappers hold the layer as base_layer
        if isinstance(module, LinearBase):
            if not isinstance(getattr(module, "quant_method", None), UnquantizedLinearMethod):
                return None
            if not hasattr(module, "cpu_linear"):  # not packed by the CPU dispatch (e.g. MLA's kv_b_proj)
                return None
            prefix, _, leaf = hf_name.rpartition(".")
            sources = [f"{prefix}.{s}" if prefix else s for s in packed.get(leaf, [leaf])]
            has_bias = getattr(module, "bias", None) is not None
            linears.append(_Linear(module, sources, has_bias))
            covered.update(id(p) for p in module.parameters(recurse=False))
        elif isinstance(module, VocabParallelEmbedding):
            if not isinstance(module.quant_method, _unquantized_embedding_method()) or not hasattr(
                module, "cpu_linear"
            ):
                return None
            embeddings.append(_Embedding(module, hf_name))
            covered.add(id(module.weight))
        else:
            for param_name, param in module.named_parameters(recurse=False):
                if id(param) not in covered:
                    params.append(_Param(param, f"{hf_name}.{param_name}"))
                    covered.add(id(param))
    if any(id(p) not in covered for p in model.parameters()):
        return None
    return CpuInplacePush(linears, embeddings, params, plain_gemm)


def _unquantized_embedding_method() -> Any:
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    return UnquantizedEmbeddingMethod
