"""Model parity: the same training on the device and on the CPU, compared step by step.

::

    from accelkit.sdk.testing.parity import assert_training_parity

    result = assert_training_parity(
        model, batches, dev, lambda params: torch.optim.AdamW(params, lr=1e-2),
        rtol=1e-4, atol=1e-4,
    )

:func:`assert_training_parity` copies ``model`` twice (the caller's model is left untouched),
trains one copy on the device and one on the CPU with the same optimizer on the same batches,
one step per batch, then puts both in eval mode and runs a forward of a probe input without
gradients. It compares, within ``rtol``/``atol`` (``|device - cpu| <= atol + rtol * |cpu|``,
element by element, as :func:`torch.testing.assert_close`):

1. the loss of every step;
2. the final ``state_dict`` (parameters and buffers, e.g. batch norm's running statistics);
3. optionally the optimizer's state (momentum buffers, Adam's moments);
4. the eval-mode outputs for the probe.

A mismatch raises :class:`ParityError` naming the first diverging step and the first diverging
state entry (in ``state_dict`` order); otherwise the :class:`ParityResult` comes back for the
test's own assertions (that training moved the model, which ops ran natively, ...).

The model must train deterministically: dropout or other random ops draw from the device's
generator on one side and the CPU's on the other. The harness needs no pytest.

:func:`train_steps`, the training loop both sides run, is public for tests that train on one
device only (op counts, a bfloat16 run followed against a float32 CPU run).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ParityError", "ParityResult", "TrainingRun", "assert_training_parity", "train_steps"]

#: ``(inputs, target)``: ``inputs`` a tensor, or a tuple of them for ``model(*inputs)``.
Batch = tuple[Any, Any]
MakeOptimizer = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
LossFn = Callable[[Any, Any], torch.Tensor]


@dataclass(frozen=True)
class TrainingRun:
    """One side of a parity check. All tensors are on the CPU, in the dtype the run computed in."""

    device: torch.device
    #: The trained copy, on ``device``, in eval mode.
    model: nn.Module
    #: One loss per step, 1-D.
    losses: torch.Tensor
    #: The final ``state_dict``: parameters and buffers.
    state: dict[str, torch.Tensor]
    #: The optimizer's tensor state, keyed ``"<parameter name>.<key>"`` (``"0.weight.exp_avg"``).
    optimizer_state: dict[str, torch.Tensor]
    #: The eval-mode forward of the probe (a tensor, or the model's tuple/list/dict of them).
    outputs: Any


@dataclass(frozen=True)
class ParityResult:
    """Both runs of a passed check."""

    reference: TrainingRun  # the CPU
    device: TrainingRun


class ParityError(AssertionError):
    """The device's training did not match the CPU's.

    ``step`` (1-based) is the first step whose loss diverged, ``entry`` the first diverging
    ``state_dict`` (or optimizer state) entry, ``outputs`` whether the inference outputs
    diverged; ``None``/``False`` where that part matched. ``result`` holds both runs.
    """

    def __init__(self, message: str, *, step: int | None, entry: str | None, outputs: bool,
                 result: ParityResult):
        super().__init__(message)
        self.step, self.entry, self.outputs, self.result = step, entry, outputs, result


def train_steps(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Iterable[Batch],
    *,
    loss_fn: LossFn = F.cross_entropy,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    autocast: torch.dtype | None = None,
) -> torch.Tensor:
    """Train ``model`` in place: per batch, ``zero_grad``, forward, ``loss_fn(output, target)``,
    backward and ``optimizer.step()``.

    :param device: where the batches are moved (default: the device of the model's first
        parameter). The model must already be there.
    :param dtype: floating-point tensors of the batches are cast to it (default: left as they are).
    :param autocast: run forward and loss under ``torch.autocast(device.type, dtype=autocast)``.
    :returns: the losses, one per step, on the CPU (1-D, in the loss's dtype).
    """
    device = torch.device(device) if device is not None else next(model.parameters()).device
    losses = []
    for inputs, target in batches:
        optimizer.zero_grad()
        with _autocast(device, autocast):
            loss = loss_fn(_forward(model, _to(inputs, device, dtype)), _to(target, device, dtype))
        loss.backward()
        optimizer.step()
        losses.append(loss.detach().to("cpu"))
    return torch.stack(losses)


def assert_training_parity(
    model: nn.Module,
    batches: Sequence[Batch],
    device: torch.device | str,
    optimizer: MakeOptimizer,
    *,
    rtol: float,
    atol: float,
    loss_fn: LossFn = F.cross_entropy,
    probe: Any = None,
    dtype: torch.dtype | None = None,
    autocast: torch.dtype | None = None,
    ignore: Mapping[str, Any] | None = None,
    compare_optimizer_state: bool = False,
) -> ParityResult:
    """Train copies of ``model`` on ``device`` and on the CPU and compare them (see the module).

    :param model: the initial weights, on the CPU; left untouched.
    :param batches: ``(inputs, target)`` pairs on the CPU, one optimizer step each.
    :param optimizer: builds an optimizer from parameters, e.g.
        ``lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9)``.
    :param rtol, atol: the tolerance for every comparison; state why it is what it is where you
        call this.
    :param loss_fn: ``loss_fn(output, target)`` gives the scalar loss (default: cross-entropy).
    :param probe: the inputs of the final eval-mode forward (default: the first batch's).
    :param dtype: the device run's dtype: its model copy and the floating-point tensors of its
        batches and probe are cast to it, while the CPU runs in the model's own dtype (so
        ``dtype=torch.bfloat16`` follows a float32 CPU run; for a bfloat16 CPU reference pass a
        bfloat16 model instead). Results are compared in the CPU's dtype.
    :param autocast: both runs' forwards and losses run under ``torch.autocast`` of their own
        device type with this dtype.
    :param ignore: ``{state_dict name: index}``: the elements of that entry selected by
        ``index`` along dim 0 (a slice, say) are not compared, in the parameter and in its
        optimizer state. For elements trained on rounding noise only, e.g. a bias whose exact
        gradient is zero: each device steps on its own noise.
    :param compare_optimizer_state: also compare the optimizer's tensor state.
    :returns: both runs, when everything matched.
    :raises ParityError: something diverged; the message names the first diverging step and
        state entry, with the differences.
    :raises AssertionError: training moved a parameter off its run's device.
    """
    device = torch.device(device)
    cpu = torch.device("cpu")
    probe = batches[0][0] if probe is None else probe
    reference = _run(model, batches, cpu, optimizer, loss_fn, probe, None, autocast)
    on_device = _run(model, batches, device, optimizer, loss_fn, probe, dtype, autocast)
    result = ParityResult(reference, on_device)
    _compare(result, rtol, atol, dict(ignore or {}), compare_optimizer_state)
    return result


# -- the runs ---------------------------------------------------------------------------------


def _run(model, batches, device, make_optimizer, loss_fn, probe, dtype, autocast) -> TrainingRun:
    model = copy.deepcopy(model).to(device, dtype) if dtype else copy.deepcopy(model).to(device)
    optimizer = make_optimizer(model.parameters())
    losses = train_steps(model, optimizer, batches, loss_fn=loss_fn, device=device, dtype=dtype,
                         autocast=autocast)
    for name, parameter in model.named_parameters():
        if parameter.device.type != device.type or device.index not in (None, parameter.device.index):
            raise AssertionError(f"training on {device} left parameter {name!r} on {parameter.device}")
    model.eval()
    with torch.no_grad(), _autocast(device, autocast):
        outputs = _cpu(_forward(model, _to(probe, device, dtype)))
    optimizer_state = {
        f"{name}.{key}": value.detach().cpu()
        for name, parameter in model.named_parameters()
        for key, value in optimizer.state.get(parameter, {}).items()
        if isinstance(value, torch.Tensor)
    }
    state = {name: value.detach().cpu() for name, value in model.state_dict().items()}
    return TrainingRun(device, model, losses, state, optimizer_state, outputs)


def _forward(model: nn.Module, inputs):
    return model(*inputs) if isinstance(inputs, tuple | list) else model(inputs)


def _to(value, device: torch.device, dtype: torch.dtype | None):
    if isinstance(value, torch.Tensor):
        cast = dtype is not None and value.is_floating_point()
        return value.to(device, dtype) if cast else value.to(device)
    if isinstance(value, tuple | list):  # a named tuple becomes a plain one
        return (list if isinstance(value, list) else tuple)(_to(v, device, dtype) for v in value)
    return value


def _cpu(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, tuple | list):
        return (list if isinstance(value, list) else tuple)(_cpu(v) for v in value)
    if isinstance(value, Mapping):
        return {k: _cpu(v) for k, v in value.items()}
    return value


def _autocast(device: torch.device, dtype: torch.dtype | None):
    return torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext()


# -- the comparison ---------------------------------------------------------------------------


def _compare(result: ParityResult, rtol: float, atol: float, ignore: dict, optimizer_state: bool) -> None:
    ref, dev = result.reference, result.device
    problems: list[str] = []

    step = _first_diverging_step(ref.losses, dev.losses, rtol, atol)
    if step is not None:
        i = step - 1
        expected, actual = ref.losses[i].item(), dev.losses[i].to(ref.losses.dtype).item()
        problems.append(
            f"first diverging step: {step} of {len(ref.losses)}: loss {actual:.9g} on {dev.device}, "
            f"{expected:.9g} on cpu (difference {abs(actual - expected):.3g}, allowed "
            f"{atol + rtol * abs(expected):.3g})\n  losses on {dev.device}: {dev.losses.tolist()}"
            f"\n  losses on cpu: {ref.losses.tolist()}"
        )

    entry = None
    tables = [("state_dict", ref.state, dev.state)]
    if optimizer_state:
        tables.append(("optimizer state", ref.optimizer_state, dev.optimizer_state))
    for what, expected, actual in tables:
        first, problem = _compare_table(what, expected, actual, dev.device, rtol, atol, ignore)
        if problem is not None:
            problems.append(problem)
            entry = entry or first

    outputs = _mismatch_tree(dev.outputs, ref.outputs, rtol, atol)
    if outputs is not None:
        problems.append(f"inference outputs diverge:\n    {_indent(outputs)}")

    if problems:
        header = f"training on {dev.device} does not match the same training on cpu (rtol={rtol}, atol={atol}):"
        raise ParityError("\n".join([header, *(f"- {p}" for p in problems)]),
                          step=step, entry=entry, outputs=outputs is not None, result=result)


def _compare_table(what: str, expected: dict, actual: dict, device: torch.device, rtol: float, atol: float,
                   ignore: dict) -> tuple[str | None, str | None]:
    """The first diverging entry of two tables of tensors, and the problem to report."""
    if expected.keys() != actual.keys():
        missing, extra = sorted(expected.keys() - actual.keys()), sorted(actual.keys() - expected.keys())
        return (missing + extra)[0], f"{what} entries differ: missing on {device} {missing}, only on {device} {extra}"
    diverging = {}
    for name in expected:
        message = _mismatch(_kept(name, actual[name], ignore), _kept(name, expected[name], ignore), rtol, atol)
        if message is not None:
            diverging[name] = message
    if not diverging:
        return None, None
    name, message = next(iter(diverging.items()))
    others = f"{len(diverging)} of {len(expected)} entries diverge: {list(diverging)}"
    return name, f"first diverging {what} entry: {name!r} ({others})\n    {_indent(message)}"


def _first_diverging_step(expected: torch.Tensor, actual: torch.Tensor, rtol: float, atol: float) -> int | None:
    close = torch.isclose(actual.to(expected.dtype), expected, rtol=rtol, atol=atol)
    bad = (~close).nonzero()
    return int(bad[0]) + 1 if len(bad) else None


def _kept(name: str, value: torch.Tensor, ignore: dict) -> torch.Tensor:
    """``value`` without the elements ``ignore`` leaves out for the parameter ``name`` is or
    belongs to (optimizer state is named ``<parameter>.<key>``)."""
    owner = next((p for p in ignore if name == p or name.startswith(p + ".")), None)
    if owner is None or value.dim() == 0:
        return value
    keep = torch.ones(value.shape[0], dtype=torch.bool)
    keep[ignore[owner]] = False
    return value[keep]


def _mismatch(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> str | None:
    if actual.dtype != expected.dtype:
        actual = actual.to(expected.dtype)
    try:
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)
    except AssertionError as error:
        lines = str(error).splitlines()
        # assert_close opens with "Tensor-likes are not close!" and a blank line: said already.
        return "\n".join(lines[2:] if len(lines) > 2 and not lines[1] else lines)
    return None


def _mismatch_tree(actual, expected, rtol: float, atol: float) -> str | None:
    """The first mismatch between two outputs: tensors, or (nested) tuples, lists and dicts of them."""
    if isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor):
        return _mismatch(actual, expected, rtol, atol)
    if isinstance(expected, Mapping) and isinstance(actual, Mapping):
        if expected.keys() != actual.keys():
            return f"keys {sorted(actual)} on the device, {sorted(expected)} on cpu"
        pairs = [(f"[{k!r}]", actual[k], expected[k]) for k in expected]
    elif isinstance(expected, tuple | list) and isinstance(actual, tuple | list):
        if len(expected) != len(actual):
            return f"{len(actual)} outputs on the device, {len(expected)} on cpu"
        pairs = [(f"[{i}]", a, e) for i, (a, e) in enumerate(zip(actual, expected))]
    elif type(actual) is not type(expected):
        return f"{type(actual).__name__} on the device, {type(expected).__name__} on cpu"
    else:
        return None if actual == expected else f"{actual!r} on the device, {expected!r} on cpu"
    for where, a, e in pairs:
        message = _mismatch_tree(a, e, rtol, atol)
        if message is not None:
            return where + (message if message.startswith("[") else f": {message}")
    return None


def _indent(text: str) -> str:
    return text.replace("\n", "\n    ")
