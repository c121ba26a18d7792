"""The op table: which ATen ops a training step's interception rounds, and how.

Each op falls in one class (docs/architecture.md, "What is rounded"):

* ``MOVE``: views, copies, indexing, factories: no arithmetic, passed through untouched;
* ``EXACT``: IEEE-exact elementwise ops (one correctly rounded operation per value): the float64
  result is the same on every machine, so it is rounded to the grid without a log entry;
* ``INEXACT``: everything else (reductions, matmul/conv, norms, softmax, transcendental and fused
  ops, and every op we do not know): each float64 output and each float64 argument the op mutates is
  rounded with the log. Unknown ops land here on purpose: logging too much is safe, too little is not;
* ``REFUSED``: ops no replay can follow: every op that draws from a torch generator (its schema
  takes one, or ``native_dropout``), fused optimizer steps, and kernels torch picks per device
  (fused attention, cuDNN and MIOpen). The interceptor raises :class:`~game.errors.UnsupportedOpError`
  at the first one, naming the op and the fix (:func:`refusal`), so a trainer learns it at step 1
  rather than from an auditor's "tampering". Torch's random functions, dropout and
  ``scaled_dot_product_attention`` are served a level above, where they are called
  (:mod:`~game.training.dispatch.stockops`); what still reaches ATen is refused here.

Apart from the mode (:mod:`~game.training.dispatch.mode`) because it is a table, not behaviour: the
Python mode and the C++ front (:mod:`~game.training.dispatch.front`) read the same plans
(:mod:`~game.training.dispatch.opplan`, worked out from these tables once per op overload), so
both round the same tensors of the same ops.
"""

from __future__ import annotations

import enum
import functools
from typing import Any

import torch
from torch import Tensor

from game.errors import UnsupportedOpError


class OpClass(enum.Enum):
    """What the rounding mode does with an op's results."""

    MOVE = "move"  # data movement: passed through
    EXACT = "exact"  # IEEE-exact elementwise: rounded, no log entry
    INEXACT = "inexact"  # may differ between machines: rounded with the log
    REFUSED = "refused"  # no replay can follow it: raises UnsupportedOpError (see refusal())


# --------------------------------------------------------------------------------------------------
# Classification (by the op's base name: namespace, ``_foreach_`` prefix and in-place ``_`` removed)
# --------------------------------------------------------------------------------------------------

#: Ops that only move, select or create values: their float outputs are bit copies of their inputs
#: (``complex`` packs two as one's lanes) or grid constants. Views are known from the schema.
MOVE_OPS: frozenset[str] = frozenset(
    {
        "clone", "contiguous", "copy", "_copy_from", "_copy_from_and_resize", "lift_fresh_copy",
        "cat", "stack", "hstack", "vstack", "index", "_unsafe_index", "index_select", "gather", "take",
        "embedding", "masked_select", "masked_scatter", "flip", "roll", "repeat", "tile",
        "repeat_interleave", "slice_scatter", "select_scatter", "diagonal_scatter", "as_strided_scatter",
        "empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided",
        "zeros", "zeros_like", "new_zeros", "zero", "ones", "ones_like", "new_ones", "eye",
        "_local_scalar_dense", "item", "resize", "set", "_unsafe_view", "_reshape_copy", "view_copy",
        "t_copy", "transpose_copy", "permute_copy", "expand_copy", "slice_copy", "select_copy",
        "unsqueeze_copy", "squeeze_copy", "detach_copy", "alias_copy", "split_copy", "unbind_copy",
        "split_with_sizes_copy", "narrow_copy", "im2col", "sort", "topk", "max_pool2d_with_indices",
        "max_pool3d_with_indices", "one_hot", "nonzero", "argmax", "argmin", "complex",
        "is_same_size", "_pin_memory", "_nested_tensor_from_mask", "profiler",
        # in-place views (t_, transpose_, ...: their schema marks a write, so they are not caught as views)
        "t", "transpose", "swapaxes", "swapdims", "squeeze", "unsqueeze", "as_strided",
        # values copied or set to 0 (a selection's backward: its gradient put in zeros; the pads' sum)
        "tril", "triu", "diag_embed", "block_diag", "diagonal_copy", "reflection_pad1d", "reflection_pad2d",
        "reflection_pad3d", "replication_pad1d", "replication_pad2d", "replication_pad3d", "slice_backward",
        "select_backward", "diagonal_backward", "value_selecting_reduction_backward",
        # values kept, put to 0 or negated, or +-1: on the grid where their inputs are, as a
        # move's are, so rounding them was a call and a launch for nothing (issue 46: ReLU and
        # its backward were 98 of a ResNet-50-shape trainer step's 575 rounding launches)
        "relu", "threshold_backward", "neg", "sign",
    }
)  # fmt: skip

#: IEEE-exact elementwise ops (one correctly rounded result per value, the same on every device),
#: selections that may meet off-grid scalars (clamp bounds, fill values), and conversions.
EXACT_OPS: frozenset[str] = frozenset(
    {
        "mul", "abs", "sqrt", "threshold", "where", "maximum",
        "minimum", "fmax", "fmin", "clamp", "clamp_min", "clamp_max", "hardtanh", "sgn",
        "copysign", "max", "min", "amax", "amin", "eq", "ne", "lt", "le", "gt", "ge", "logical_and",
        "logical_or", "logical_not", "logical_xor", "isnan", "isinf", "isfinite", "floor", "ceil",
        "trunc", "fill", "full", "full_like", "new_full", "scalar_tensor", "masked_fill", "_to_copy",
        "constant_pad_nd", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "__and__", "__or__",
        "__xor__", "__lshift__", "__rshift__", "bitwise_left_shift", "bitwise_right_shift",
    }
)  # fmt: skip

#: Exact ops that are not on complex tensors: a complex product sums two products, a complex
#: quotient, square root or sign divides, and a modulus is a hypot, in ways that differ between
#: libraries in the last bit. With a complex tensor argument a call is inexact, rounded with the
#: log; the componentwise ones (add, sub, where, ...) stay exact on complex tensors, and neg a move.
COMPLEX_INEXACT: frozenset[str] = frozenset({"mul", "abs", "sqrt", "sgn", "div"})

#: Ops that draw from torch's generator (base names; every overload, also those whose schema takes
#: no ``Generator``, e.g. ``randperm.default``). An op whose schema takes one is refused unlisted.
RANDOM_OPS: frozenset[str] = frozenset(
    {
        "bernoulli", "uniform", "normal", "normal_functional", "random", "exponential", "cauchy",
        "log_normal", "geometric", "rand", "randn", "randint", "randperm", "rand_like", "randn_like",
        "randint_like", "multinomial", "native_dropout", "_fused_dropout", "poisson", "binomial",
        "_standard_gamma", "_sample_dirichlet", "rrelu", "rrelu_with_noise", "rrelu_with_noise_functional",
    }
)  # fmt: skip

#: What to do instead of an op that draws from torch's generator.
RANDOM_FIX = (
    "draws from torch's random generator, which gives other bits on other hardware: call F.dropout / "
    "nn.Dropout or torch's random functions where vgame serves them from its counter RNG (a step's "
    "StockOps, a model's InitMode), or draw with game.training.numerics.rng"
)
_CUDNN_FIX = (
    "is a cuDNN/MIOpen kernel, which only some devices run: switch cuDNN off for the step "
    "(torch.backends.cudnn.enabled = False; the cuda profile does)"
)
_ATTENTION_FIX = (
    "is a fused attention kernel torch picks per device (another device runs other ops): call "
    "F.scaled_dot_product_attention where vgame serves it (a step's StockOps writes its math out), "
    "or write attention out with matmul and softmax"
)
_OPTIMIZER_FIX = (
    "is a fused optimizer step, whose intermediate results are not rounded: pass foreach=True, "
    "fused=False to the optimizer"
)

#: Ops refused besides the random ones (base names), with what to do instead.
REFUSED_OPS: dict[str, str] = {
    **dict.fromkeys(("_fill_mem_eff_dropout_mask", "_cudnn_init_dropout_state"), RANDOM_FIX),
    **dict.fromkeys(("_fused_adam", "_fused_adamw", "_fused_sgd", "_fused_adagrad"), _OPTIMIZER_FIX),
    **dict.fromkeys(
        (
            "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
            "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
            "_scaled_dot_product_fused_attention_overrideable", "_scaled_dot_product_attention_math_for_mps",
            "_flash_attention_forward", "_flash_attention_forward_no_dropout_inplace",
            "_efficient_attention_forward", "_cudnn_attention_forward", "_triton_scaled_dot_attention",
        ),
        _ATTENTION_FIX,
    ),
    **dict.fromkeys(("_native_multi_head_attention", "_transformer_encoder_layer_fwd"), (
        "is nn.MultiheadAttention's / nn.TransformerEncoderLayer's fused inference path: call the module "
        "with autograd on, in training mode"
    )),
    **dict.fromkeys(("_grouped_mm", "_scaled_grouped_mm"), (
        "is torch's grouped matmul, which has no float64 kernel (and sums in an order of the device's "
        "own): a transformers mixture-of-experts model runs its experts through it; build its config "
        "with experts_implementation=\"eager\", which runs each expert as plain matmuls"
    )),
    "_fused_rms_norm": (
        "is a fused RMS norm kernel that only some devices run: call F.rms_norm / nn.RMSNorm where vgame "
        "serves them (a step's StockOps writes the norm out)"
    ),
    **dict.fromkeys(
        (
            "cudnn_batch_norm", "cudnn_convolution", "cudnn_convolution_relu", "cudnn_convolution_add_relu",
            "cudnn_convolution_transpose", "cudnn_grid_sampler", "cudnn_affine_grid_generator", "_cudnn_rnn",
            "_cudnn_ctc_loss", "miopen_batch_norm", "miopen_convolution", "miopen_convolution_relu",
            "miopen_convolution_add_relu", "miopen_convolution_transpose", "miopen_depthwise_convolution",
            "miopen_rnn", "miopen_ctc_loss",
        ),
        _CUDNN_FIX,
    ),
}  # fmt: skip

#: Ops refused where they would be differentiated (a floating input that requires grad, with grad
#: mode on), and why: PyTorch's backward formula for them takes another path where a Python
#: dispatch mode is on (``areAnyTensorSubclassLike``: the Python mode computes prod's gradient from
#: cumulative products, the C++ front by a division), so the two interceptors would compute, and
#: log, different ops (a step serves ``torch.prod``/``cumprod`` with its own backward: :mod:`.products`).
GRADIENT_REFUSED: dict[str, str] = {
    name: (
        f"is refused where it is differentiated: PyTorch computes its gradient one way under a Python "
        f"dispatch mode and another way without, so two machines could differ: {fix}"
    )
    for name, fix in {
        "prod": "for positive values, exp of the sum of the logs; or multiply the factors out",
        "cumprod": "for positive values, exp of the cumulative sum of the logs",
    }.items()
}

#: Ops whose composite callers above the dispatcher ask for fewer results where no Python dispatch
#: mode is on (ATen's ``_may_require_fw_or_bw_grad`` counts any mode as a tensor subclass):
#: ``linalg.svdvals``, ``linalg.eigvalsh`` and the norms and ranks built on them ask for the singular
#: vectors or eigenvectors under the Python mode and not through the C++ front, which would log
#: empty tensors where the Python mode logs full ones. The front sets the flag (base name -> its
#: argument) true, so the two compute, round and log the same results.
FULL_CALLS: dict[str, str] = {"_linalg_svd": "compute_uv", "_linalg_eigh": "compute_v"}

#: Ops whose class depends on their arguments (see :func:`classify`).
CONDITIONAL_OPS: frozenset[str] = frozenset(
    {"add", "sub", "rsub", "div", "index_put", "scatter", "round", *GRADIENT_REFUSED}
)

#: Ops that mutate arguments their schema does not mark ``(a!)``: (positions, position of ``training``).
HIDDEN_WRITES: dict[str, tuple[tuple[int, ...], int]] = {
    "native_batch_norm": ((3, 4), 5),
    "cudnn_batch_norm": ((3, 4), 5),
    "miopen_batch_norm": ((3, 4), 5),
}


#: Ops the log names by another op's name. PyTorch's backward formulas of indexing (``index``,
#: ``gather``, ``index_select``, ``take``) call these ops in place where no Python dispatch mode is on
#: (the C++ front sees ``_index_put_impl_``, ``scatter_add_``, ...) and out of place where one is
#: (``areAnyTensorSubclassLike``: the Python mode sees ``index_put``, ``scatter_add``, ...): the same
#: kernel and values under two names, so a log recorded through one interceptor did not replay
#: through the other. The log names both forms alike.
LOG_NAMES: dict[str, str] = {
    "aten._index_put_impl_.default": "aten.index_put.default",
    "aten.index_fill_.int_Tensor": "aten.index_fill.int_Tensor",  # trace's backward
    "aten.index_fill_.int_Scalar": "aten.index_fill.int_Scalar",
    "aten.scatter_add_.default": "aten.scatter_add.default",
    "aten.index_add_.default": "aten.index_add.default",
    "aten.put_.default": "aten.put.default",
    # ``ctc_loss`` with length tensors: the front sees the lengths made lists, the Python mode the
    # tensors (the kernel reads them to lists itself)
    "aten._ctc_loss.Tensor": "aten._ctc_loss.default",
    "aten._ctc_loss_backward.Tensor": "aten._ctc_loss_backward.default",
}

#: Base names classified as another's (``_index_put_impl_``: ``index_put``'s kernel, by ``accumulate``).
_BASE_ALIASES: dict[str, str] = {"_index_put_impl": "index_put"}


@functools.cache
def base_name(func: Any) -> str:
    """``aten::_foreach_add_`` -> ``add``; ``aten::_softmax`` -> ``_softmax``; other namespaces keep theirs."""
    full: str = func._schema.name
    ns, _, name = full.partition("::")
    if ns == "profiler":
        return "profiler"
    if ns != "aten":
        return full
    if name.startswith("_foreach_"):
        name = name[len("_foreach_") :]
    if name.endswith("_") and not name.endswith("__"):
        name = name[:-1]
    return _BASE_ALIASES.get(name, name)


@functools.cache
def static_class(func: Any) -> OpClass | None:
    """The class an op has whatever its arguments, or None when it depends on them."""
    schema = func._schema
    if any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns):
        return OpClass.MOVE  # a view: computes nothing
    name = base_name(func)
    if name in REFUSED_OPS or _draws(func):
        return OpClass.REFUSED
    if name in MOVE_OPS:
        return OpClass.MOVE
    if name in CONDITIONAL_OPS or name in COMPLEX_INEXACT:
        return None
    if name in EXACT_OPS:
        return OpClass.EXACT
    return OpClass.INEXACT


def _draws(func: Any) -> bool:
    """Whether the op draws from a torch generator: it is listed, or its schema takes one (a new
    random op is caught without a list)."""
    return base_name(func) in RANDOM_OPS or any("Generator" in str(a.type) for a in func._schema.arguments)


@functools.cache
def op_name(func: Any) -> str:
    """``str(func)``, e.g. ``aten.addmm.default``, or its name in :data:`LOG_NAMES`: the op name in
    the log, in band tables and in coverage sets."""
    name = str(func)
    return LOG_NAMES.get(name, name)


def refusal(func: Any, where: str = "") -> UnsupportedOpError:
    """The error for a ``REFUSED`` op (``where``: e.g. ``"step 3: "``), naming the op and the fix."""
    name = op_name(func)
    fix = REFUSED_OPS.get(base_name(func)) or GRADIENT_REFUSED.get(base_name(func)) or RANDOM_FIX
    return UnsupportedOpError(f"{where}{name} {fix}", op=name, fix=fix)


#: Floating dtypes a step never rounds: an inexact op's result in one is the machine's own (one is
#: rounded by way of its float64 twin, see :mod:`~game.training.dispatch.widen`, where the op has
#: a float32, half or bfloat16 argument or its result is in the default dtype; one no twin gives
#: in float64 is not).
UNROUNDED_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.complex64, torch.complex32)
#: What to do instead of an inexact op with such a result in a step.
UNROUNDED_FIX = (
    "compute it from float64, float32, half or bfloat16 tensors: a step runs in float64 and rounds "
    "every result to the task's grid (an inexact op on float32, half or bfloat16 tensors, or with a "
    "result in the default dtype, is computed in float64, rounded and converted), and an inexact "
    "result that cannot be computed so is this machine's own, which another machine's would differ from"
)


def unrounded_refusal(name: str, dtype: torch.dtype, where: str = "") -> UnsupportedOpError:
    """The error for an inexact op whose result is in one of :data:`UNROUNDED_DTYPES` in a step
    that rounds: it would be neither rounded nor logged, so replay on other hardware could differ."""
    return UnsupportedOpError(
        f"{where}{name} gives a {str(dtype).removeprefix('torch.')} result, which is not rounded: "
        f"{UNROUNDED_FIX}",
        op=name,
        fix=UNROUNDED_FIX,
    )


#: What to do instead of a sparse gradient in a step.
SPARSE_FIX = (
    "build the model's embeddings with sparse=False (nn.Embedding, nn.EmbeddingBag): a dense gradient, "
    "from which SGD and Adagrad make the same update; a step rounds its results lane by lane, and a "
    "sparse tensor's values are summed where its indices repeat, in an order of the machine's"
)


def sparse_refusal(name: str, layout: torch.layout, where: str = "") -> UnsupportedOpError:
    """The error for an op whose float result is sparse (``nn.Embedding(sparse=True)``'s gradient):
    it used to stop inside the rounding kernels with torch's own words on memory formats."""
    return UnsupportedOpError(
        f"{where}{name} gives a sparse ({str(layout).removeprefix('torch.')}) result, which is not "
        f"rounded: {SPARSE_FIX}",
        op=name,
        fix=SPARSE_FIX,
    )


def refuse_unrounded(name: str, tensors: list[Tensor], where: str = "") -> None:
    """Raise :func:`unrounded_refusal` for the first of an inexact op's results in one of
    :data:`UNROUNDED_DTYPES` (the Python mode's and the front's call both ask here)."""
    for t in tensors:
        if t.dtype in UNROUNDED_DTYPES:
            raise unrounded_refusal(name, t.dtype, where)


__all__ = [
    "COMPLEX_INEXACT",
    "CONDITIONAL_OPS",
    "EXACT_OPS",
    "FULL_CALLS",
    "GRADIENT_REFUSED",
    "HIDDEN_WRITES",
    "LOG_NAMES",
    "MOVE_OPS",
    "RANDOM_FIX",
    "RANDOM_OPS",
    "REFUSED_OPS",
    "SPARSE_FIX",
    "UNROUNDED_DTYPES",
    "UNROUNDED_FIX",
    "OpClass",
    "base_name",
    "op_name",
    "refusal",
    "refuse_unrounded",
    "sparse_refusal",
    "static_class",
    "unrounded_refusal",
]
