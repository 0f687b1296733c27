"""Argument validation with messages that name the argument and the allowed range.

Every public function of the library and every notebook's parameter cell goes through
these, so that a bad input fails at the door with a sentence a reader can act on.
"""
from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Iterable, Sequence

import torch

__all__ = [
    "NonFiniteError",
    "FLOAT_DTYPES",
    "check_int",
    "check_float",
    "check_choice",
    "check_bool",
    "check_int_list",
    "check_float_list",
    "check_tensor",
    "check_same_dtype_device",
    "check_dtype",
    "settings_from_dict",
    "check_model_input",
]

# The closed forms are checked against autograd in these two; half precision overflows the
# scores of ordinary inputs (exp(s) > 65504 at s > 11) and is refused rather than half-supported.
FLOAT_DTYPES = (torch.float32, torch.float64)


class NonFiniteError(ValueError):
    """A tensor holds NaN or infinite values where finite ones are needed: bad input at the
    door, or an overflow inside a computation (the training loop turns the latter into
    :class:`~attention_dynamics.training.TrainingDiverged`)."""


def check_int(name: str, value, low: int | None = None, high: int | None = None) -> int:
    """An integer in [low, high] (either bound may be None for unbounded)."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an integer{_range(low, high)}, got {value!r}")
    value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{name} must be an integer{_range(low, high)}, got {value}")
    return value


def check_float(
    name: str,
    value,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """A finite real number in the interval given (closed unless *_open is set)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a real number{_interval(low, high, low_open, high_open)}, got {value!r}")
    value = float(value)
    bad = not math.isfinite(value)
    if low is not None:
        bad |= value <= low if low_open else value < low
    if high is not None:
        bad |= value >= high if high_open else value > high
    if bad:
        raise ValueError(f"{name} must be a finite number{_interval(low, high, low_open, high_open)}, got {value!r}")
    return value


def check_choice(name: str, value, choices: Iterable):
    choices = list(choices)
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def check_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def check_int_list(name: str, values, low: int | None = None, high: int | None = None, *, min_len: int = 1) -> list[int]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) < min_len:
        raise TypeError(f"{name} must be a list of at least {min_len} integers{_range(low, high)}, got {values!r}")
    return [check_int(f"{name}[{i}]", v, low, high) for i, v in enumerate(values)]


def check_float_list(name: str, values, low: float | None = None, high: float | None = None, *,
                     low_open: bool = False, min_len: int = 1) -> list[float]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) < min_len:
        raise TypeError(f"{name} must be a list of at least {min_len} numbers, got {values!r}")
    return [check_float(f"{name}[{i}]", v, low, high, low_open=low_open) for i, v in enumerate(values)]


def check_tensor(
    name: str,
    x,
    *,
    ndim: int | None = None,
    min_ndim: int | None = None,
    kind: str = "float",
    finite: bool = True,
    nonempty: bool = False,
) -> torch.Tensor:
    """A torch tensor of the given kind ('float': float32 or float64, 'bool' or 'int') and rank.
    ``nonempty``: every dimension must have at least one entry."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if kind == "float" and x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must have dtype float32 or float64, got {x.dtype}")
    if kind == "bool" and x.dtype != torch.bool:
        raise TypeError(f"{name} must have dtype torch.bool, got {x.dtype}")
    if kind == "int" and (x.dtype.is_floating_point or x.dtype == torch.bool or x.dtype.is_complex):
        raise TypeError(f"{name} must have an integer dtype, got {x.dtype}")
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    if min_ndim is not None and x.dim() < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimensions, got shape {tuple(x.shape)}")
    if nonempty and 0 in x.shape:
        raise ValueError(f"{name} must have no empty dimension, got shape {tuple(x.shape)}")
    if finite and kind == "float" and not bool(torch.isfinite(x).all()):
        raise NonFiniteError(f"{name} contains NaN or infinite values")
    return x


def check_dtype(name: str, dtype) -> torch.dtype:
    """A floating dtype the library computes in: float32 or float64."""
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be torch.float32 or torch.float64, got {dtype!r}")
    return dtype


def check_same_dtype_device(**tensors: torch.Tensor) -> None:
    names = list(tensors)
    first = tensors[names[0]]
    for n in names[1:]:
        t = tensors[n]
        if t.dtype != first.dtype:
            raise TypeError(f"{n} has dtype {t.dtype} but {names[0]} has {first.dtype}; they must match")
        if t.device != first.device:
            raise ValueError(f"{n} is on {t.device} but {names[0]} is on {first.device}; they must match")


def settings_from_dict(cls, settings, name: str):
    """An instance of the settings dataclass ``cls`` from a mapping (a chapter's parameter
    ``name``): the settings given, the defaults for the rest; an unknown setting is named."""
    from dataclasses import fields

    if not isinstance(settings, dict):
        raise TypeError(f"{name} must be a mapping of settings, got {type(settings).__name__}")
    known = [f.name for f in fields(cls)]
    unknown = sorted(set(settings) - set(known))
    if unknown:
        raise ValueError(f"{name} has no setting(s) {unknown}; its settings are {known}")
    return cls(**settings)


def check_model_input(x, kind: str, *, vocab: int | None = None, d_in: int | None = None,
                      dtype: torch.dtype | None = None) -> None:
    """A sequence model's input: (B, T) token ids below ``vocab`` (``kind="tokens"``) or
    (B, T, d_in) vectors of the model's ``dtype`` (``kind="linear"``); no empty dimension."""
    if kind == "tokens":
        if not isinstance(x, torch.Tensor) or x.dtype.is_floating_point or x.dim() != 2:
            raise TypeError(f"x must be (B, T) integer token ids, got {getattr(x, 'dtype', type(x))} of shape "
                            f"{tuple(getattr(x, 'shape', ()))}")
        if x.numel() and (int(x.min()) < 0 or int(x.max()) >= vocab):
            raise ValueError(f"token ids must lie in [0, {vocab - 1}]")
    else:
        check_tensor("x", x, ndim=3)
        if x.shape[-1] != d_in:
            raise ValueError(f"x must have shape (B, T, {d_in}), got {tuple(x.shape)}")
        if dtype is not None and x.dtype != dtype:
            raise TypeError(f"x has dtype {x.dtype} but the model's weights are {dtype}")
    if 0 in x.shape:
        raise ValueError(f"x must have no empty dimension, got shape {tuple(x.shape)}")


def _range(low, high) -> str:
    if low is None and high is None:
        return ""
    if high is None:
        return f" >= {low}"
    if low is None:
        return f" <= {high}"
    return f" in [{low}, {high}]"


def _interval(low, high, low_open, high_open) -> str:
    if low is None and high is None:
        return ""
    lo = "(-inf" if low is None else ("(" if low_open else "[") + f"{low:g}"
    hi = "inf)" if high is None else f"{high:g}" + (")" if high_open else "]")
    return f" in {lo}, {hi}"
