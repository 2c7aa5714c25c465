"""The scaling projection: a training step measured on one simulated device, estimated at N chips.

The run is one chip's share of a step, or a part of it the plan repeats: the model (or one layer
of it, ``layers`` times) at the per-chip shapes (the batch per chip; the matmul widths divided by
the tensor-parallel degree; the experts held per chip). Its estimate gives the device seconds
and FLOPs; the caller gives the bytes each parallelism moves. The projection adds the
communication the plan implies, with the target's interconnect, and the overlap rule below.

Per step and chip, with ``r = layers * batches`` copies of the run::

    compute   = r * run_device_seconds + recompute * r * forward_seconds
    dp        = all_reduce(G / fsdp, group=data)                      # gradients (HSDP: the shard)
    fsdp      = 2 * all_gather(P, group=fsdp) + reduce_scatter(G, group=fsdp)
    tp        = 4 * layers * batches * all_reduce(A, group=tensor)    # 2 forward, 2 backward
    ep        = 4 * layers * batches * all_to_all(E, group=expert)    # dispatch + combine, fwd+bwd
    step      = max(compute, dp + fsdp) + tp + ep                     # overlap on
              = compute + dp + fsdp + tp + ep                         # overlap off
    bubble    : step *= 1 + (pipeline - 1) / microbatches             # 1F1B schedule
    MFU       = r * model_flops_of_the_run / (step * peak)

``P`` and ``G`` are the chip's parameter and gradient bytes for the whole model (the run's,
times ``layers``); ``A`` the activation one tensor-parallel all-reduce carries (tokens of the
run times the hidden width times the element size); ``E`` what one chip sends in one all-to-all.
Collective times are the ring-algorithm costs of ``accelkit.stats()["distributed"]`` (bandwidth
per direction of the chip's links; a device's share where a chip holds several). A group placed
over more chips than one interconnect domain joins (a TPU slice, a Trainium instance) takes the
hierarchical cost: the ring inside the domain, plus the ring across domains of ``1/k`` of the
message at the scale-out network's per-chip share (``k`` group members per domain).

Groups are placed innermost first: tensor, then expert, fsdp, data (the usual mesh order), so the
chips a group spans are its degree times the degrees inside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from accelkit._runtime.distributed.stats import estimate_seconds
from accelkit.sdk import DeviceModel, Interconnect


@dataclass(frozen=True)
class ScalingPlan:
    """How a training step is spread over chips, and how the measured run maps onto it.

    :ivar data: data-parallel degree (whole parameters per replica; gradients all-reduced).
    :ivar fsdp: fully-sharded degree (parameters gathered for forward and backward, gradients
        reduce-scattered).
    :ivar tensor: tensor-parallel degree (each layer's matmuls split; activations all-reduced).
    :ivar pipeline: pipeline stages; the run then is one stage's layers.
    :ivar expert: expert-parallel degree, placed over the data and fsdp ranks (must divide
        ``data * fsdp``); its all-to-alls need ``expert_bytes``.
    :ivar layers: copies of the run in one chip's share of the model (the run is one layer: the
        model's layer count, divided by ``pipeline``).
    :ivar batches: copies of the run's batch in one chip's step (the batch per chip over the
        run's, when the run is a smaller batch at the same shapes; or gradient accumulation).
    :ivar microbatches: microbatches per step through the pipeline (the bubble's denominator).
    :ivar recompute: share of the forward recomputed in the backward (1.0: full
        rematerialisation), which needs ``forward_seconds``.
    :ivar overlap: whether data-parallel and fsdp collectives overlap with compute.
    """

    data: int = 1
    fsdp: int = 1
    tensor: int = 1
    pipeline: int = 1
    expert: int = 1
    layers: float = 1
    batches: float = 1
    microbatches: int = 1
    recompute: float = 0.0
    overlap: bool = True

    def __post_init__(self) -> None:
        for name in ("data", "fsdp", "tensor", "pipeline", "expert", "microbatches"):
            if getattr(self, name) < 1:
                raise ValueError(f"ScalingPlan.{name} must be at least 1")
        if (self.data * self.fsdp) % self.expert:
            raise ValueError(f"ScalingPlan.expert={self.expert} must divide data * fsdp = {self.data * self.fsdp}")
        if self.layers <= 0 or self.batches <= 0 or self.recompute < 0:
            raise ValueError("ScalingPlan: layers and batches must be positive, recompute not negative")

    @property
    def chips(self) -> int:
        """Devices the plan spans: data * fsdp * tensor * pipeline."""
        return self.data * self.fsdp * self.tensor * self.pipeline

    @classmethod
    def parse(cls, text: str) -> ScalingPlan:
        """``"dp=64,fsdp=4,tp=4,layers=32"`` (dp, fsdp, tp, pp, ep; any field by name)."""
        alias = {"dp": "data", "tp": "tensor", "pp": "pipeline", "ep": "expert"}
        fields: dict[str, Any] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, _, value = item.partition("=")
            key = alias.get(key.strip(), key.strip())
            if key not in cls.__dataclass_fields__:
                raise ValueError(f"unknown plan field {key!r} in {text!r}")
            kind = cls.__dataclass_fields__[key].type
            fields[key] = value.strip().lower() in ("1", "true", "yes", "on") if kind == "bool" else (
                int(value) if kind == "int" else float(value))
        return cls(**fields)


@dataclass(frozen=True)
class ScalingProjection:
    """The estimated step at N chips: seconds per part, the step, MFU. A model, never a measurement.

    :ivar target: the generation projected for.
    :ivar chips: devices the plan spans.
    :ivar step_seconds: one training step, per the module's equations.
    :ivar mfu: model FLOPs per step over ``step_seconds`` times the device's bf16 peak.
    :ivar model_flops: FLOPs per device and step (the run's, repeated; no recompute).
    :ivar seconds: ``{"compute", "data", "fsdp", "tensor", "expert", "exposed", "bubble"}``:
        per chip and step; ``exposed`` is the collectives' time not hidden under compute.
    :ivar note: the model's assumptions and what it leaves out.
    """

    target: str
    chips: int
    step_seconds: float
    mfu: float
    model_flops: float
    seconds: Mapping[str, float]
    note: str

    def as_dict(self) -> dict[str, Any]:
        return {"target": self.target, "chips": self.chips, "step_seconds": self.step_seconds,
                "mfu": self.mfu, "model_flops": self.model_flops, "seconds": dict(self.seconds),
                "note": self.note}


LEFT_OUT = ("stragglers and step-to-step variance; host input pipelines; checkpoint saving; the "
            "compiler's scheduling (collectives are ideal rings, overlapped perfectly where the plan "
            "allows); network congestion and collective latency; the optimizer's update outside the run; "
            "memory capacity (whether the plan fits)")


def project_scaling(estimate: Mapping[str, Any], plan: ScalingPlan, *, parameter_bytes: float,
                    gradient_bytes: float | None = None, activation_bytes: float = 0.0,
                    expert_bytes: float = 0.0, forward_seconds: float | None = None,
                    device_model: DeviceModel | None = None, dtype: torch.dtype = torch.bfloat16,
                    ) -> ScalingProjection:
    """Estimate one training step on ``plan.chips`` chips from a run on one simulated device.

    :param estimate: ``accelkit.stats()["estimate"]`` after one step of the run (its ``seconds``,
        the device time, and ``flops``; the launch time is left out: at scale the programs are
        compiled and issued ahead of the device).
    :param parameter_bytes: bytes of the run's parameters (per layer if ``plan.layers`` repeats it).
    :param gradient_bytes: bytes of its gradients as reduced (default: ``parameter_bytes``).
    :param activation_bytes: what one tensor-parallel all-reduce carries for the run's batch.
    :param expert_bytes: what one chip sends in one expert all-to-all for the run's batch.
    :param forward_seconds: device seconds of the run's forward alone (for ``plan.recompute``).
    :param device_model: the target (default: the active backend's,
        :func:`accelkit.sdk.active_device_model`); its interconnect and its
        peak FLOP/s at ``dtype`` (MFU's denominator) are used.
    :raises ValueError: the estimate has no FLOPs or is for another target; recompute without
        ``forward_seconds``; tensor or expert parallelism without their bytes; a group larger
        than the interconnect's domain when the target has no scale-out network.

    What it leaves out: see :data:`LEFT_OUT` (also in the result's ``note``).
    """
    model = device_model or _active_model()
    if estimate.get("target") not in (None, model.name):
        raise ValueError(f"the estimate is for {estimate['target']!r}, the device model for {model.name!r}")
    if not estimate.get("flops"):
        raise ValueError("the estimate counts no FLOPs: MFU needs them")
    if plan.recompute and forward_seconds is None:
        raise ValueError("plan.recompute needs forward_seconds (the run's forward alone)")
    if plan.tensor > 1 and not activation_bytes:
        raise ValueError("tensor parallelism needs activation_bytes (what one all-reduce carries)")
    if plan.expert > 1 and not expert_bytes:
        raise ValueError("expert parallelism needs expert_bytes (what one all-to-all sends per chip)")
    if model.interconnect is None and plan.chips > 1:
        raise ValueError(f"{model.name}: no interconnect figures to project with")

    copies = plan.layers * plan.batches
    params = parameter_bytes * plan.layers
    grads = (parameter_bytes if gradient_bytes is None else gradient_bytes) * plan.layers
    compute = copies * (estimate["seconds"] + plan.recompute * (forward_seconds or 0.0))

    link = _Links(model, plan)
    parts = {
        "compute": compute,
        "data": link.cost("all_reduce", grads / plan.fsdp, "data"),
        "fsdp": 2 * link.cost("all_gather", params, "fsdp") + link.cost("reduce_scatter", grads, "fsdp"),
        "tensor": 4 * copies * link.cost("all_reduce", activation_bytes, "tensor"),
        "expert": 4 * copies * link.cost("all_to_all", expert_bytes, "expert"),
    }
    hideable = parts["data"] + parts["fsdp"]
    blocking = parts["tensor"] + parts["expert"]
    step = (max(compute, hideable) if plan.overlap else compute + hideable) + blocking
    parts["exposed"] = step - compute
    parts["bubble"] = step * (plan.pipeline - 1) / plan.microbatches
    step += parts["bubble"]

    peak = model.peak_flops.get(dtype)
    if not peak:
        raise ValueError(f"{model.name}: no peak FLOP/s for {dtype}")
    model_flops = copies * estimate["flops"]
    return ScalingProjection(
        target=model.name, chips=plan.chips, step_seconds=step, mfu=model_flops / (step * peak),
        model_flops=model_flops, seconds=parts,
        note=(f"projection from one device's estimate: ring collectives on {link.describe()}, data/fsdp "
              f"collectives {'overlapped with' if plan.overlap else 'after'} compute, tensor/expert ones "
              f"blocking; left out: {LEFT_OUT}"),
    )


class _Links:
    """Each parallel group's collective cost on the target's interconnect, by its placement."""

    _ORDER = ("tensor", "expert", "fsdp", "data")  # innermost first

    def __init__(self, model: DeviceModel, plan: ScalingPlan) -> None:
        self.model, self.plan = model, plan
        per_chip = model.extra.get("cores_per_chip") or model.extra.get("devices_per_chip") or 1
        self.devices_per_chip = int(per_chip)  # the devices of one chip share its links

    def cost(self, kind: str, nbytes: float, group: str) -> float:
        size = getattr(self.plan, group)
        if size < 2 or not nbytes:
            return 0.0
        inner = math.prod(getattr(self.plan, g) for g in self._ORDER[:self._ORDER.index(group)])
        if group == "expert":  # expert ranks are data/fsdp ranks: they start right after tensor
            inner = self.plan.tensor
        link = self.model.interconnect
        domain = (link.domain_chips or math.inf) * self.devices_per_chip
        span = inner * size
        if span <= domain:
            return self._ring(kind, nbytes, size, link)
        if link.scale_out is None:
            raise ValueError(f"the {group} group spans {span} devices, more than one {link.name} domain "
                             f"({link.domain_chips} chips), and {self.model.name} has no scale-out figures")
        members_per_domain = max(1, int(domain // inner))  # group members inside one domain
        domains = math.ceil(size / members_per_domain)
        # Hierarchical: reduce/gather inside the domain, then across domains on 1/k of the message.
        inside = self._ring(kind, nbytes, members_per_domain, link)
        across = self._ring(kind, nbytes / members_per_domain, domains, link.scale_out)
        return inside + across

    def _ring(self, kind: str, nbytes: float, size: int, link: Interconnect) -> float:
        share = Interconnect(name=link.name, bandwidth=link.bandwidth / self.devices_per_chip,
                             latency=link.latency)
        return estimate_seconds(kind, int(nbytes), size, share) or 0.0

    def describe(self) -> str:
        link = self.model.interconnect
        if link is None:
            return "no interconnect (one device)"
        text = f"{link.name} ({link.bandwidth / 1e9:.0f} GB/s per direction per chip"
        if link.scale_out is not None:
            text += (f"; {link.scale_out.name} {link.scale_out.bandwidth / 1e9:.2f} GB/s per chip beyond "
                     f"{link.domain_chips} chips")
        return text + ")"


def _active_model() -> DeviceModel:
    from accelkit.sdk import active_device_model

    return active_device_model()
