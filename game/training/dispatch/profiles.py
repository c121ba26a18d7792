"""Hardware profiles: the machines a trainer and an auditor may run on, real and emulated.

Bit-exact replay is only interesting when the two parties' float64 results differ. On one CPU they
mostly do not, so besides the real differences (torch's thread count, a CUDA device) a profile can
*emulate* what other hardware does to an inexact op, at the same place the rounding happens
(:class:`game.training.dispatch.mode.RoundingMode` calls :meth:`Profile.compute` and
:meth:`Profile.perturb` before it rounds):

* ``split_k``: matmul-family ops and conv forward are recomputed as a sequential float64 sum over
  chunks of ``split_k`` along the reduction dimension: a real change of summation order, like the
  tile shapes of another GPU;
* ``noise``: every inexact floating result is multiplied by ``1 + u * noise`` with ``u`` uniform in
  ``[-1, 1)``: a stress test for the rounding log. Noise is hardware: it is not reproducible (unless
  ``noise_seed`` is set) and need not be.
"""

from __future__ import annotations

import contextlib
import logging
import math
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from game.errors import ConfigError
from game.registry import Registry

log = logging.getLogger(__name__)

aten = torch.ops.aten

#: Default bound of the ``noisy`` profile's relative perturbation.
DEFAULT_NOISE = 2.0**-40


@dataclass(frozen=True)
class Profile:
    """One (real or emulated) machine: where tensors live and what happens to inexact results."""

    name: str
    description: str
    device: str = "cpu"  # torch device of model, optimizer and batch
    threads: int | None = None  # torch intra-op threads while the profile is applied; None: leave as is
    split_k: int | None = None  # chunk length of emulated split-K reductions; None: torch's own op kernels
    noise: float = 0.0  # bound of the relative perturbation of inexact results; 0: none
    noise_seed: int | None = None  # seed of the perturbation; None: fresh randomness per generator
    flips_vectors: bool = False  # every other eigenvector / singular-vector pair negated (another LAPACK)

    def __post_init__(self) -> None:
        if not 0.0 <= self.noise < 1.0 or not math.isfinite(self.noise):
            raise ConfigError(f"noise: {self.noise} is outside [0, 1)")

    def available(self) -> bool:
        """Whether this machine can run the profile (a CUDA profile needs a CUDA device)."""
        if self.device.startswith("cuda"):
            return bool(torch.cuda.is_available())
        return True

    def require(self) -> None:
        """Raise :class:`ConfigError` where this machine cannot run the profile: one wording for
        every command that takes one (``vgame train``, ``audit``, ``bench``, a node's start)."""
        if not self.available():
            raise ConfigError(
                f"profile {self.name!r} is not available on this machine (see `vgame profiles`)"
            )

    def rounding_kernels(self) -> str:
        """Which kernels round this profile's tensors: ``c`` (CPU, compiled on first use), ``triton``
        (CUDA), ``torch`` (the reference kernels, everywhere), or ``none`` when it cannot run here."""
        if not self.available():
            return "none"
        if self.device.startswith("cuda"):
            from game.training.numerics import cuda_kernels

            probe = torch.empty(1, dtype=torch.float64, device=self.device)
            return "triton" if cuda_kernels.usable(probe) else "torch"
        from game.training.native import library

        return "c" if library.available() else "torch"

    def interceptor(self) -> str:
        """What meets this profile's ops: ``front`` (the C++ dispatch front: a profile that emulates
        nothing, on any device, the front built here) or ``python`` (the ``TorchDispatchMode``)."""
        from game.training.native import front

        return "front" if not self.emulates and front.available() else "python"

    @property
    def emulates(self) -> bool:
        """Whether :meth:`compute` or :meth:`perturb` differ from the native op."""
        return self.split_k is not None or self.noise > 0.0 or self.flips_vectors

    @contextlib.contextmanager
    def apply(self) -> Iterator[None]:
        """Set torch's thread count for the duration (restored afterwards).

        On CUDA, cuDNN is switched off for the duration: with it, BatchNorm dispatches to
        ``cudnn_batch_norm`` instead of ``native_batch_norm``, a different op sequence from a CPU
        party's, so the two could not share a rounding log.
        """
        self.require()
        old_threads = torch.get_num_threads()
        old_cudnn = torch.backends.cudnn.enabled
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        if self.device.startswith("cuda"):
            torch.backends.cudnn.enabled = False
        try:
            yield
        finally:
            if self.threads is not None:
                torch.set_num_threads(old_threads)
            torch.backends.cudnn.enabled = old_cudnn

    # ---- emulation hooks (called by RoundingMode for inexact ops) ------------------------------------

    def compute(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run an inexact op the way this machine would: native, or with split-K summation order."""
        if self.flips_vectors and func in _FLIPPED:
            return _FLIPPED[func](func(*args, **kwargs))
        if self.split_k is not None:
            impl = _SPLITK.get(func)
            if impl is not None:
                out = impl(self.split_k, args, kwargs)
                if out is not None:
                    return out
        return func(*args, **kwargs)

    def noise_generator(self) -> NoiseSource | None:
        """A per-step source of perturbations, or None when the profile adds no noise."""
        if self.noise <= 0.0:
            return None
        return NoiseSource(self.noise, self.noise_seed)


class NoiseSource:
    """Bounded random relative perturbations, one torch.Generator per device."""

    def __init__(self, bound: float, seed: int | None) -> None:
        self.bound = bound
        self._seed = seed if seed is not None else secrets.randbits(63)
        self._gens: dict[torch.device, torch.Generator] = {}

    def perturb(self, t: Tensor) -> None:
        """Multiply ``t`` in place by ``1 + u * bound``, ``u`` uniform in ``[-1, 1)``.

        float64 results get the profile's bound. A float32 result (the plain fp32 baseline) gets at
        least float32's own half-ulp (2**-24), as a bound below that would round straight back: that
        makes the noisy profile's fp32 results differ by about an ulp, like another machine's.
        """
        if t.dtype not in (torch.float64, torch.float32) or t.numel() == 0:
            return
        gen = self._gens.get(t.device)
        if gen is None:
            gen = torch.Generator(device=t.device)
            gen.manual_seed(self._seed)
            self._gens[t.device] = gen
        bound = self.bound if t.dtype == torch.float64 else max(self.bound, 2.0**-24)
        u = torch.rand(t.shape, dtype=torch.float64, device=t.device, generator=gen)
        factor = u.mul_(2.0 * bound).add_(1.0 - bound)
        if t.dtype == torch.float64:
            t.mul_(factor)
        else:
            t.copy_(t.to(torch.float64).mul_(factor))


def _flip_eigh(out: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """``_linalg_eigh``'s (L, Q) with every other eigenvector negated: a valid answer, which
    another LAPACK build or cuSOLVER may give."""
    values, vectors = out
    vectors = vectors.clone()
    vectors[..., :, 1::2] *= -1.0
    return values, vectors


def _flip_svd(out: tuple[Tensor, Tensor, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """``_linalg_svd``'s (U, S, Vh) with every other pair of singular vectors negated together."""
    u, s, vh = out
    u, vh = u.clone(), vh.clone()
    u[..., :, 1::2] *= -1.0
    vh[..., 1::2, :] *= -1.0
    return u, s, vh


#: Ops whose vectors another machine may give with other signs (``flips_vectors``).
_FLIPPED: dict[Any, Callable[[Any], Any]] = {
    torch.ops.aten._linalg_eigh.default: _flip_eigh,
    torch.ops.aten._linalg_svd.default: _flip_svd,
}


# --------------------------------------------------------------------------------------------------
# Split-K emulation: sequential sums over chunks of the reduction dimension
# --------------------------------------------------------------------------------------------------


def _chunks(k: int, size: int) -> list[tuple[int, int]]:
    return [(i, min(i + size, k)) for i in range(0, k, size)]


def _seq_sum(parts: Iterator[Tensor]) -> Tensor:
    acc = next(parts).clone()
    for p in parts:
        acc.add_(p)
    return acc


def _mm(c: int, a: Tensor, b: Tensor) -> Tensor:
    k = a.shape[-1]
    if k <= c:
        return torch.matmul(a, b)
    return _seq_sum(torch.matmul(a[..., i:j], b[..., i:j, :]) for i, j in _chunks(k, c))


def _scalar(kwargs: dict[str, Any], name: str, args: tuple[Any, ...], pos: int) -> Any:
    if name in kwargs:
        return kwargs[name]
    return args[pos] if len(args) > pos else 1


def _add_bias(acc: Tensor, bias: Tensor, beta: Any, alpha: Any) -> Tensor:
    if alpha != 1:
        acc = acc.mul_(alpha)
    if beta == 0:
        return acc
    return acc.add_(bias if beta == 1 else bias * beta)


def _splitk_mm(c: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor | None:
    return _mm(c, args[0], args[1])


def _splitk_addmm(c: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor | None:
    bias, a, b = args[0], args[1], args[2]
    beta, alpha = _scalar(kwargs, "beta", args, 3), _scalar(kwargs, "alpha", args, 4)
    acc = _mm(c, a, b)
    out = _add_bias(acc, bias, beta, alpha)
    return out if out.shape == acc.shape else None


def _splitk_mv(c: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor | None:
    return _mm(c, args[0], args[1].unsqueeze(-1)).squeeze(-1)


def _splitk_addmv(c: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor | None:
    bias, a, v = args[0], args[1], args[2]
    beta, alpha = _scalar(kwargs, "beta", args, 3), _scalar(kwargs, "alpha", args, 4)
    acc = _mm(c, a, v.unsqueeze(-1)).squeeze(-1)
    return _add_bias(acc, bias, beta, alpha)


def _splitk_dot(c: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor | None:
    return _mm(c, args[0].unsqueeze(0), args[1].unsqueeze(-1)).reshape(())


def _splitk_conv(c: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor | None:
    """Forward conv as a sum over input-channel chunks covering about ``c`` reduction terms each."""
    if kwargs:
        return None
    x, w, bias, stride, padding, dilation, transposed, output_padding, groups = args
    if transposed or groups != 1 or w.dim() < 3:
        return None
    per_channel = math.prod(w.shape[2:])
    step = max(1, c // per_channel)
    cin = w.shape[1]
    if cin <= step:
        return None
    conv = aten.convolution.default
    acc = _seq_sum(
        conv(x[:, i:j], w[:, i:j], None, stride, padding, dilation, False, output_padding, 1)
        for i, j in _chunks(cin, step)
    )
    if bias is not None:
        acc.add_(bias.reshape((1, -1) + (1,) * (acc.dim() - 2)))
    return acc


_SplitK = Callable[[int, tuple[Any, ...], dict[str, Any]], Tensor | None]

_SPLITK: dict[Any, _SplitK] = {
    aten.mm.default: _splitk_mm,
    aten.bmm.default: _splitk_mm,
    aten.addmm.default: _splitk_addmm,
    aten.baddbmm.default: _splitk_addmm,
    aten.mv.default: _splitk_mv,
    aten.addmv.default: _splitk_addmv,
    aten.dot.default: _splitk_dot,
    aten.convolution.default: _splitk_conv,
}


# --------------------------------------------------------------------------------------------------
# The catalogue
# --------------------------------------------------------------------------------------------------

_PROFILES: Registry[Profile] = Registry(
    "profile",
    {
        p.name: p
        for p in (
            Profile("cpu-1t", "CPU, 1 torch thread", threads=1),
            Profile("cpu-2t", "CPU, 2 torch threads (parallel reductions)", threads=2),
            Profile(
                "splitk-16",
                "CPU, matmul/conv reductions summed in chunks of 16 (emulated GPU tiles)",
                split_k=16,
            ),
            Profile(
                "splitk-64",
                "CPU, matmul/conv reductions summed in chunks of 64 (emulated GPU tiles)",
                split_k=64,
            ),
            Profile(
                "noisy",
                "CPU, every inexact float64 result perturbed by a random relative 2^-40, every other "
                "eigenvector and singular-vector pair negated (stress)",
                noise=DEFAULT_NOISE,
                flips_vectors=True,
            ),
            Profile("cuda", "CUDA GPU, cuDNN off (its BatchNorm is another op sequence)", device="cuda"),
        )
    },
    where="profile",
)

PROFILE_NAMES: tuple[str, ...] = _PROFILES.names()


def get_profile(name: str) -> Profile:
    """The named profile, or a ConfigError listing the valid names."""
    return _PROFILES.get(name)


def list_profiles() -> list[dict[str, Any]]:
    """Every profile as ``{name, description, available, rounding_kernels, interceptor}`` (for
    ``vgame profiles``)."""
    return [
        {
            "name": p.name,
            "description": p.description,
            "available": p.available(),
            "rounding_kernels": p.rounding_kernels(),
            "interceptor": p.interceptor(),
        }
        for p in _PROFILES.values()
    ]


def available_profiles() -> list[Profile]:
    """The profiles this machine can run."""
    return [p for p in _PROFILES.values() if p.available()]


__all__ = [
    "DEFAULT_NOISE",
    "PROFILE_NAMES",
    "NoiseSource",
    "Profile",
    "available_profiles",
    "get_profile",
    "list_profiles",
]
