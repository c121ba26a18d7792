"""Stock ``torch.nn`` functions served with the same ATen ops on every device (keying:
:mod:`~game.training.dispatch.draws`).

* **Dropout** (``F.dropout``, ``dropout1d/2d/3d``, ``alpha_dropout``, ``feature_alpha_dropout`` and
  their ``torch.*`` forms, which ``nn.Dropout*`` call): torch draws the mask with ``bernoulli_`` on
  a CPU and ``native_dropout`` on CUDA, other ops and other bits. Here, in training with ``0 < p <
  1``, the keep mask comes from the counter RNG and is applied as ``x * (keep * (1/(1-p)))``, as
  the presets' dropout used to: IEEE-exact multiplies, so no log entry. Feature dropout
  draws one value per (row, channel). Alpha dropout is ``x * (keep * a) + b`` with torch's ``a``
  and ``b`` worked out in Python floats: exact too. Otherwise (eval, ``p`` 0 or 1) torch's own call
  runs, which draws nothing.
* **``F.scaled_dot_product_attention``**: torch picks a fused kernel per device (flash, efficient,
  cuDNN, the CPU's flash), whose insides are not rounded and whose op sequence differs; here its
  math, written out: ``softmax(q k^T * scale + mask) v`` with ``scale = 1/sqrt(E)`` by default,
  ``enable_gqa``'s repeated key and value heads, masked scores set to the finite :data:`MASK_FILL`
  (never -inf into the rounding), a row with every key masked giving 0 as torch's ``_safe_softmax``
  does, and ``dropout_p`` through the served dropout.
* **``F.multi_head_attention_forward``** (``nn.MultiheadAttention``, the ``nn.Transformer*`` layers):
  run with ``need_weights=True``, its explicit path (torch otherwise calls SDPA from inside, where
  the function mode cannot see it), with boolean masks given as finite fills. Its attention dropout
  is the ``F.dropout`` it calls inside, served for the call (:func:`_attention_dropout`); it was
  refused.
* **``F.rrelu``**: in training a uniform slope per negative value, ``u * (upper - lower) + lower``;
  in eval torch's ``leaky_relu`` with slope ``(lower + upper) / 2``.
* **Recurrent layers' dropout** (``nn.LSTM``, ``nn.GRU``, ``nn.RNN`` with ``num_layers > 1`` and
  ``dropout > 0``, in training): torch draws it inside its recurrent kernel. Here the layers run one
  at a time (torch's own kernel, one layer and no dropout each), with the served dropout between
  them, where torch puts its own: on each layer's output but the last.
* **``F.rms_norm``**: written out as the CPU's decomposition (``pow``, ``mean``, ``add``, ``rsqrt``,
  ``mul``): a CUDA build may run the fused ``_fused_rms_norm`` kernel instead, another op sequence.
* **Defaults read from the dtype** (``F.rms_norm``'s ``eps``, ``nn.RMSNorm``'s when none is given;
  ``torch.nan_to_num``'s ``posinf`` and ``neginf``): a step computes a float32 model in float64, so
  torch would take float64's ``finfo``; they are the grid's (:func:`grid_finfo`), as the model would
  have them in float32. float64's largest value does not even fit the grid: ``nan_to_num`` of an inf
  stopped the step as an overflow.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from game.training.dispatch.draws import Draws, name_of, serves
from game.training.numerics import rounding

#: Fill of masked attention scores (``models.ATTENTION_MASK_FILL``): finite, so no inf reaches the
#: rounding, and far enough below any score that its exp() is exactly 0.
MASK_FILL = -1e30

#: SELU's alpha, as torch's alpha dropout has it.
_ALPHA = 1.7580993408473766


def dropout(
    d: Draws,
    name: str,
    x: Tensor,
    p: float,
    *,
    feature: bool = False,
    alpha: bool = False,
    inplace: bool = False,
) -> Tensor:
    """Served dropout in training, ``0 < p < 1``: ``x * (keep * (1/(1-p)))`` (alpha: ``x * (keep *
    a) + b``); ``keep`` one draw per element, or per (row, channel) for feature dropout."""
    if feature and x.dim() < 2:
        raise RuntimeError("Feature dropout requires at least 2 dimensions in the input")
    shape = (x.shape[0], x.shape[1], *(1,) * (x.dim() - 2)) if feature else x.shape
    if not alpha:
        m = d.scaled(name, shape, 1.0 - p, x.device, 1.0 / (1.0 - p), x.dtype)
        return x.mul_(m) if inplace else x * m
    a = 1.0 / math.sqrt((_ALPHA * _ALPHA * p + 1.0) * (1.0 - p))
    kept, dropped = _ALPHA * a * p, _ALPHA * a * p - _ALPHA * a
    keep, m = d.scaled_mask(name, shape, 1.0 - p, x.device, a, x.dtype)
    shift = torch.full(shape, dropped, dtype=x.dtype, device=x.device).masked_fill_(keep, kept)
    return x.mul_(m).add_(shift) if inplace else x * m + shift


#: Each dropout function -> (feature, alpha, always in place, its training flag's name and default).
_DROPOUTS: dict[Any, tuple[bool, bool, bool, str, bool]] = {
    F.dropout: (False, False, False, "training", True),
    F.dropout1d: (True, False, False, "training", True),
    F.dropout2d: (True, False, False, "training", True),
    F.dropout3d: (True, False, False, "training", True),
    F.alpha_dropout: (False, True, False, "training", False),
    F.feature_alpha_dropout: (True, True, False, "training", False),
    torch.dropout: (False, False, False, "train", True),
    torch.feature_dropout: (True, False, False, "train", True),
    torch.alpha_dropout: (False, True, False, "train", True),
    torch.feature_alpha_dropout: (True, True, False, "train", True),
    torch.dropout_: (False, False, True, "train", True),
    torch.feature_dropout_: (True, False, True, "train", True),
    torch.alpha_dropout_: (False, True, True, "train", True),
    torch.feature_alpha_dropout_: (True, True, True, "train", True),
}
#: F.dropout1d and F.dropout3d take an unbatched input (one dimension fewer) as one row.
_UNBATCHED = {F.dropout1d: (2, (2, 3)), F.dropout3d: (4, (4, 5))}


@serves(*_DROPOUTS)
def _dropout(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    feature, alpha, always_inplace, flag, default = _DROPOUTS[func]
    given = dict(zip(("input", "p", flag, "inplace"), args, strict=False)) | kwargs
    x, p = given["input"], float(given.get("p", 0.5))
    train, inplace = bool(given.get(flag, default)), always_inplace or bool(given.get("inplace", False))
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not train or p in (0.0, 1.0) or x.numel() == 0 or x.is_meta:
        return func(*args, **kwargs)  # draws nothing
    unbatched, dims = _UNBATCHED.get(func, (-1, ()))
    if dims and x.dim() not in dims and func is F.dropout1d:
        raise RuntimeError(f"dropout1d: Expected 2D or 3D input, but received a {x.dim()}D input")
    if x.dim() == unbatched:  # one row, as torch does
        y = x.unsqueeze_(0) if inplace else x.unsqueeze(0)
        out = dropout(d, name_of(func), y, p, feature=True, inplace=inplace)
        return out.squeeze_(0) if inplace else out.squeeze(0)
    return dropout(d, name_of(func), x, p, feature=feature, alpha=alpha, inplace=inplace)


@serves(F.scaled_dot_product_attention)
def _sdpa(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
    given = dict(zip(names, args, strict=False)) | kwargs
    return attention(
        d, given["query"], given["key"], given["value"], given.get("attn_mask"), float(given.get("dropout_p", 0.0)),
        bool(given.get("is_causal", False)), given.get("scale"), bool(given.get("enable_gqa", False)),
    )  # fmt: skip


def attention(
    d: Draws,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """``F.scaled_dot_product_attention``'s math with ordinary ops (module docstring)."""
    L, S = q.shape[-2], k.shape[-2]
    if is_causal and mask is not None:
        raise RuntimeError("scaled_dot_product_attention: an explicit attn_mask with is_causal=True")
    if enable_gqa and q.dim() >= 3 and k.shape[-3] != q.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], -3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], -3)
    scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)
    dead: Tensor | None = None  # rows whose every key is masked: torch's _safe_softmax gives them 0
    if is_causal:  # the top-left triangle: no row is all masked
        causal = torch.ones(L, S, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(causal.logical_not(), MASK_FILL)
    elif mask is not None and mask.dtype == torch.bool:
        scores = scores.masked_fill(mask.logical_not(), MASK_FILL)
        dead = mask.logical_not().all(-1, keepdim=True)
    elif mask is not None:  # -inf (and anything below the fill) becomes the fill
        scores = scores + mask.clamp(min=MASK_FILL)
        dead = (mask == -math.inf).all(-1, keepdim=True)
    weights = torch.softmax(scores, dim=-1)
    if dead is not None:
        weights = weights.masked_fill(dead, 0.0)
    if dropout_p > 0.0:
        weights = dropout(d, "scaled_dot_product_attention", weights, dropout_p)
    return torch.matmul(weights, v)


_MHA_ARGS = (
    "query", "key", "value", "embed_dim_to_check", "num_heads", "in_proj_weight", "in_proj_bias", "bias_k",
    "bias_v", "add_zero_attn", "dropout_p", "out_proj_weight", "out_proj_bias",
)  # fmt: skip


@contextlib.contextmanager
def _attention_dropout(d: Draws, batch: int) -> Iterator[None]:
    """While torch's ``F.multi_head_attention_forward`` runs, the ``dropout`` it calls on its
    attention weights (``torch.nn.functional``'s module global, looked up at the call) is the served
    one, drawn as ``(batch, heads, L, S)``, one row per example (draws.py). A function mode cannot
    serve it: torch hands the outer call to the mode, which is off while it runs the function's body,
    so no mode sees the inner call. The swap is process-wide: another thread's ``F.dropout`` during
    the call gets torch's own."""
    torch_own = F.dropout
    caller = threading.get_ident()

    def served(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
        if not training or p == 0.0 or threading.get_ident() != caller:
            return torch_own(input, p, training, inplace)
        rows = input.reshape(batch, -1, *input.shape[1:])
        return dropout(d, "multi_head_attention_forward", rows, float(p)).reshape(input.shape)

    F.dropout = served
    try:
        yield
    finally:
        F.dropout = torch_own


@serves(F.multi_head_attention_forward)
def _mha(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    given = dict(zip(_MHA_ARGS, args, strict=False)) | kwargs
    need = bool(given.get("need_weights", True))
    q = given["query"]
    for name in ("attn_mask", "key_padding_mask"):
        m = given.get(name)
        if m is not None:
            finite = torch.zeros(m.shape, dtype=q.dtype, device=q.device)
            given[name] = (
                finite.masked_fill(m, MASK_FILL) if m.dtype == torch.bool else m.clamp(min=MASK_FILL)
            )
    given["need_weights"] = True  # the explicit path: no SDPA inside, where it would not be served
    with _attention_dropout(d, q.shape[1] if q.dim() == 3 else 1):  # (L, batch, E), or one unbatched row
        out, weights = func(**given)
    return out, (weights if need else None)


@serves(F.rrelu, torch.rrelu, torch.rrelu_, F.rrelu_)
def _rrelu(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    given = dict(zip(("input", "lower", "upper", "training", "inplace"), args, strict=False)) | kwargs
    x = given["input"]
    lower, upper = float(given.get("lower", 1.0 / 8)), float(given.get("upper", 1.0 / 3))
    inplace = func in (torch.rrelu_, F.rrelu_) or bool(given.get("inplace", False))
    if not given.get("training", False) or x.is_meta:
        mid = (lower + upper) / 2
        return F.leaky_relu_(x, mid) if inplace else F.leaky_relu(x, mid)
    slopes = d.uniform(name_of(func), x.shape, x.device, x.dtype).mul_(upper - lower).add_(lower)
    out = torch.where(x <= 0, x * slopes, x)
    return x.copy_(out) if inplace else out


#: The recurrent kernels, by function: whether the hidden state is an (h, c) pair.
_RNNS = {torch.lstm: True, torch.gru: False, torch.rnn_tanh: False, torch.rnn_relu: False}


@serves(*_RNNS)
def _rnn(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """torch's recurrent kernel, layer by layer where it would draw its dropout: its arguments are
    ``(input, hx, params, has_biases, layers, dropout, train, bidirectional, batch_first)``, or for a
    packed sequence ``(data, batch_sizes, hx, params, ...)`` without ``batch_first``."""
    packed = len(args) == 9 and isinstance(args[3], list | tuple)
    if kwargs or len(args) != 9:
        return func(*args, **kwargs)
    lead = 2 if packed else 1  # the input, and a packed sequence's batch sizes
    hx, params, biases, layers, p, train, bidirectional = args[lead : lead + 7]
    if not train or float(p) == 0.0 or int(layers) == 1:
        return func(*args)  # draws nothing
    batch_first = bool(args[8]) and not packed
    directions = 2 if bidirectional else 1
    per_layer = len(params) // int(layers)
    states: list[list[Tensor]] = [[] for _ in range(2 if _RNNS[func] else 1)]
    out = args[0]
    for layer in range(int(layers)):
        rows = slice(layer * directions, (layer + 1) * directions)
        state = [h[rows] for h in hx] if _RNNS[func] else hx[rows]
        weights = list(params[layer * per_layer : (layer + 1) * per_layer])
        fixed = (biases, 1, 0.0, train, bidirectional)
        result = func(out, *args[1:lead], state, weights, *fixed, *(() if packed else (args[8],)))
        out = result[0]
        for kept, h in zip(states, result[1:], strict=True):
            kept.append(h)
        if layer < int(layers) - 1:  # as torch: on every layer's output but the last
            if packed or batch_first:
                out = dropout(d, name_of(func), out, float(p))
            else:  # drawn batch first, so that each example's rows are its own (draws.py)
                out = dropout(d, name_of(func), out.transpose(0, 1), float(p)).transpose(0, 1)
    return (out, *(torch.cat(kept) for kept in states))


def grid_finfo(d: Draws, dtype: torch.dtype) -> tuple[float, float]:
    """(eps, largest finite value) of ``dtype`` as a model computing in it sees them, or, for float64
    in a step that rounds to a grid (``d.bits``), of the grid: float32's at 32 bits."""
    if dtype == torch.float64 and d.bits is not None:
        return 2.0 ** -(d.bits - 9), rounding.grid_max(d.bits)
    info = torch.finfo(dtype)
    return float(info.eps), float(info.max)


@serves(F.rms_norm, torch.rms_norm)
def _rms_norm(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    given = dict(zip(("input", "normalized_shape", "weight", "eps"), args, strict=False)) | kwargs
    x, weight, eps = given["input"], given.get("weight"), given.get("eps")
    shape = given["normalized_shape"]
    dims = tuple(range(-(1 if isinstance(shape, int) else len(shape)), 0))
    floor = grid_finfo(d, x.dtype)[0] if eps is None else float(eps)
    y = x * torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + floor)
    return y * weight if weight is not None else y


@serves(torch.nan_to_num, torch.nan_to_num_, torch.Tensor.nan_to_num, torch.Tensor.nan_to_num_)
def _nan_to_num(d: Draws, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    given = dict(zip(("input", "nan", "posinf", "neginf"), args, strict=False)) | kwargs
    x = given.pop("input", None)
    if (
        not isinstance(x, Tensor)
        or not x.is_floating_point()
        or given.keys() - {"nan", "posinf", "neginf", "out"}
    ):
        return func(*args, **kwargs)
    top = grid_finfo(d, x.dtype)[1]
    if given.get("posinf") is None:
        given["posinf"] = top
    if given.get("neginf") is None:
        given["neginf"] = -top
    return func(x, **given)


__all__ = ["MASK_FILL", "attention", "dropout", "grid_finfo"]
