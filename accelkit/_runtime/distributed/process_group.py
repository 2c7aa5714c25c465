"""A c10d process group for an accelkit device whose bytes travel through host memory and gloo.

``dist.init_process_group("<device>")`` (and every ``new_group``, ``DeviceMesh`` and DTensor
group on it) builds one :class:`HostStagedProcessGroup`. Each collective:

1. checks that the ranks agree (:mod:`accelkit._runtime.distributed.agreement`): mismatched sizes, dtypes, roots,
   reduce ops or collectives raise :class:`CollectiveMismatchError` on every rank instead of
   gloo aborting the process;
2. copies the device tensors to contiguous host tensors (CPU tensors are used in place, and
   so is device memory its device lends for a collective that rewrites it: :mod:`accelkit._runtime.distributed.staging`);
3. runs gloo's collective on them (real TCP transport, asynchronous in gloo's threads);
4. on ``wait()``, copies the results back into the device tensors, views and non-contiguous
   tensors included, without bumping their version counters (see :class:`~._staging.Staged`).

Semantics are gloo's on CPU tensors, which the conformance suite compares against per rank:
same dtypes, same results, same reduce ops, except the two gloo lacks or defines otherwise:
``PREMUL_SUM`` and ``AVG`` run as NCCL's (what FSDP2 and DDP are written against), as gloo's
SUM with an op on the device before it (the factor; AVG's ``1 / world`` on floating point) or
after it (AVG's division on integers): see :mod:`accelkit._runtime.distributed.reductions`. ``Work.wait`` and
``Work.get_future`` complete the collective on the calling thread; a failure (a rank that timed
out or died) raises :class:`CollectiveError` naming the collective, the group and the fix.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from accelkit._runtime.distributed.addresses import gloo_group, this_attempts_keys
from accelkit._runtime.distributed.agreement_channel import ChannelBroken, open_channel
from accelkit._runtime.distributed.agreement import (
    DTYPE_CODES,
    CollectiveError,
    CollectiveMismatchError,
    Fingerprint,
    describe_tensor,
    disagreement,
    dtype_code,
    exchange_summaries,
    mismatch_message,
)
from accelkit._runtime.distributed.stats import STATS
from accelkit._runtime.distributed.reductions import Reduction, reduction
from accelkit._runtime.distributed.staging import HostPool, Staged, assign, hosts


CHECKS_ENV = "ACCELKIT_COLLECTIVE_CHECKS"


def checks_mode() -> str:
    """How groups check the ranks' agreement before each collective (``ACCELKIT_COLLECTIVE_CHECKS``):
    ``on`` (default) swaps fingerprints over the group's own connections
    (:mod:`accelkit._runtime.distributed.agreement_channel`, through gloo where the ranks cannot reach each other that way),
    ``gloo`` always through gloo (a small all-gather per collective; for networks that allow
    only gloo's ports), ``off`` not at all: gloo then aborts the process on mismatched sizes, as
    plain gloo does."""
    from accelkit.sdk import env_choice

    return env_choice(CHECKS_ENV, ("on", "gloo", "off"), "on")


def _nbytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _shapes(tensors: Sequence[torch.Tensor]) -> tuple:
    return tuple((dtype_code(t.dtype), tuple(t.shape)) for t in tensors)


class _StagedWork(dist._Work):
    """The pending part of one collective: gloo's works, then the write-back of the results.

    ``wait()`` and ``get_future()`` finish it on the calling thread (the future is complete when
    returned; its value is the collective's output tensors, as c10d's own backends give).
    """

    def __init__(self, group: HostStagedProcessGroup, kind: str, pending: list[Any],
                 finish: Callable[[], Any], nbytes: int, started: float):
        super().__init__()
        self._group, self._kind, self._pending, self._finish = group, kind, pending, finish
        self._nbytes, self._started = nbytes, started
        self._future: torch.futures.Future = torch.futures.Future()
        self._done = False

    def wait(self, timeout: timedelta | None = None) -> bool:
        if not self._done:
            with self._group.failure(self._kind):
                for work in self._pending:
                    work.wait()
            result = self._finish()
            self._done = True
            STATS.record(self._kind, self._nbytes, self._group.size(), time.perf_counter() - self._started)
            self._future.set_result(result)
        return True

    def get_future(self) -> torch.futures.Future:
        self.wait()
        return self._future

    def is_completed(self) -> bool:
        return self._done

    def is_success(self) -> bool:
        return self._done

    def source_rank(self) -> int:
        return getattr(self, "_source", -1)


class HostStagedProcessGroup(dist.ProcessGroup):
    """The c10d process group of one accelkit device type, for every tensor of a group (device
    and CPU tensors alike: c10d uses a Python process group for all devices)."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta, *, device_type: str):
        super().__init__(rank, size)
        self._device_type = device_type
        self._timeout = timeout
        store = this_attempts_keys(store)
        self._gloo = gloo_group(dist.PrefixStore("gloo", store), rank, size, timeout)
        # c10d asks a group for the backend of a device (init_process_group(device_id=...),
        # DeviceMesh); gloo is what moves this group's bytes, for the device and for the CPU.
        for device in (torch.device(device_type), torch.device("cpu")):
            self._register_backend(device, dist.ProcessGroup.BackendType.CUSTOM, self._gloo)
        self._checks = dist.PrefixStore("accelkit-mismatch", store)
        self._name = ""
        self._desc = ""
        self._sequence = 0
        self._coalescing: list[_StagedWork] | None = None
        mode = checks_mode()
        self._checked = mode != "off"
        self._channel = open_channel(self._checks, rank, size, timeout) if mode == "on" else None
        if mode == "on" and self._channel is None:
            _warn_checks_through_gloo()
        STATS.check_path("off" if mode == "off" else "sockets" if self._channel is not None else "gloo")
        self._pool = HostPool()
        self._open: list[Staged] = []  # staged since the last collective began

    # -- identity ------------------------------------------------------------------------------

    def getBackendName(self) -> str:
        return self._device_type

    def getGroupName(self) -> str:
        return self._name

    def setGroupName(self, name: str) -> None:
        self._name = name

    def getGroupDesc(self) -> str:
        return self._desc

    def setGroupDesc(self, desc: str) -> None:
        self._desc = desc

    def __repr__(self) -> str:
        return f"HostStagedProcessGroup({self._device_type!r}, rank={self.rank()}, size={self.size()}, name={self._name!r})"

    # -- the shared steps ------------------------------------------------------------------------

    @contextlib.contextmanager
    def failure(self, kind: str) -> Iterator[None]:
        """Turn a transport failure inside the block into a :class:`CollectiveError`."""
        try:
            yield
        except CollectiveError:
            raise
        except (RuntimeError, OSError) as exc:
            text = str(exc)
            peer = getattr(exc, "peer_rank", None)  # set by the agreement channel, not by gloo
            who, log = (f"rank {peer}", f"rank {peer}'s log") if peer is not None else ("another rank", "every rank's log")
            if isinstance(exc, ChannelBroken):
                cause = (f"{text}, which left its connections out of step; the group cannot be used "
                         "again: destroy it and create a new one")
            elif "Timed out" in text or "timed out" in text:
                cause = (f"{who} did not take part within the group's timeout "
                         f"({self._timeout.total_seconds():g} s): it is slow, stuck, dead, or calls "
                         f"a different collective. Check {log}; if it is only slow, pass "
                         "a longer timeout= to init_process_group/new_group")
            elif "Application timeout caused pair closure" in text:
                cause = ("an earlier collective of this group timed out, which closed its connections; "
                         "the group cannot be used again: destroy it and create a new one")
            elif peer is not None and isinstance(exc, (ConnectionResetError, BrokenPipeError)):
                cause = f"rank {peer}'s process exited or lost its connection (a peer process exited); see {log}"
            elif "reset by peer" in text or "closed" in text.lower() or "Broken pipe" in text:
                cause = "a peer process exited or lost its connection; see that rank's log"
            else:
                cause = "the gloo transport failed"
            raise CollectiveError(
                f"{kind} on process group {self._name!r} ({self._device_type}, rank {self.rank()} "
                f"of {self.size()}) failed: {cause}. Transport error: {text.splitlines()[0] if text else exc!r}"
            ) from exc

    def _stage(self, tensor: torch.Tensor, copy_in: bool, in_place: bool = False) -> Staged:
        staged = Staged(tensor, copy_in, self._pool, in_place=in_place)
        self._open.append(staged)
        return staged

    def _inputs(self, tensors: Sequence[torch.Tensor]) -> list[Staged]:
        return [self._stage(t, True) for t in tensors]

    def _outputs(self, tensors: Sequence[torch.Tensor]) -> list[Staged]:
        return [self._stage(t, False) for t in tensors]

    def _claim_staged(self) -> list[Staged]:
        """The buffers staged for the collective being started, to release when it is done."""
        staged, self._open = self._open, []
        return staged

    def _agree(self, kind: str, fingerprint: Fingerprint, meanwhile: Sequence[Staged] = ()) -> None:
        """Check that every rank's arguments fit together (see :mod:`accelkit._runtime.distributed.agreement`);
        ``meanwhile``'s host buffers are filled while the fingerprints travel."""
        self._sequence += 1
        if not self._checked:
            for staged in meanwhile:
                staged.fill()
            if fingerprint.problem:
                raise CollectiveMismatchError(f"{kind} on process group {self._name!r}: {fingerprint.problem}")
            return
        world = self.size()
        mine = fingerprint.packed(world)

        def fill() -> None:
            for staged in meanwhile:
                staged.fill()

        if self._channel is not None:
            with self.failure(kind):
                rows = self._channel.swap(mine, fill)
        else:
            table = torch.empty(world * len(mine) // 8, dtype=torch.int64)
            with self.failure(kind):
                pending = self._gloo._allgather_base(table, torch.frombuffer(bytearray(mine), dtype=torch.int64))
            try:
                fill()
            finally:
                with self.failure(kind):
                    pending.wait()
            whole = table.numpy().tobytes()
            rows = [whole[r * len(mine):(r + 1) * len(mine)] for r in range(world)]
        if fingerprint.agrees_with(rows, mine):
            return
        table = torch.frombuffer(bytearray(b"".join(rows)), dtype=torch.int64)
        found = disagreement(table.view(world, -1))
        if found:
            with self.failure(kind):
                summaries = exchange_summaries(self._checks, str(self._sequence), self.rank(), self.size(), fingerprint)
            raise CollectiveMismatchError(mismatch_message(kind, self._name, found, summaries))

    def _run(self, kind: str, fingerprint: Fingerprint, launch: Callable[[], Any],
             outputs: Sequence[Staged], result: Any, nbytes: int,
             after: Callable[[], None] | None = None) -> _StagedWork:
        """Check agreement, launch gloo, and return the work that writes ``outputs`` back, then
        runs ``after`` (a reduction's last step on the device)."""
        staged_here = self._claim_staged()
        self._agree(kind, fingerprint, staged_here)
        started = time.perf_counter()
        with self.failure(kind):
            pending = launch()

        def finish() -> Any:
            for staged in outputs:
                staged.write_back()
            if after is not None:
                after()
            for staged in staged_here:
                staged.release()
            return result

        work = _StagedWork(self, kind, pending if isinstance(pending, list) else [pending], finish, nbytes, started)
        if self._coalescing is not None:
            self._coalescing.append(work)
        return work

    def _per_rank_problem(self, what: str, tensors: Sequence[torch.Tensor], like: torch.Tensor) -> str | None:
        """Why a list of one tensor per rank, each like ``like``, is not that, or None."""
        if len(tensors) != self.size():
            return f"the {what} has {len(tensors)} tensors; the group has {self.size()} ranks"
        if any(t.numel() != like.numel() or t.dtype != like.dtype for t in tensors):
            return f"every tensor of the {what} must be {describe_tensor(like)}"
        return None

    # -- reductions ------------------------------------------------------------------------------

    def _reduction(self, kind: str, op: Any, tensors: Sequence[torch.Tensor]) -> Reduction:
        """How this group runs ``op`` on ``tensors`` (see :mod:`accelkit._runtime.distributed.reductions`); raises
        ``TypeError`` on this rank, before anything is staged, for a dtype the op cannot reduce."""
        return reduction(kind, op, {t.dtype for t in tensors}, self.size(), self._device_type)

    def _in_place(self, kind: str, call: str, tensors: list[torch.Tensor], same: tuple,
                  gloo_call: Callable[[list[torch.Tensor]], Any]) -> _StagedWork:
        """A collective that reads and rewrites ``tensors`` (reductions, broadcast).

        :param call: how the call reads in messages, e.g. ``all_reduce(SUM)``.
        :param same: what must be equal on every rank besides the tensors' dtypes and shapes.
        """
        staged = [self._stage(t, True, in_place=True) for t in tensors]
        fp = Fingerprint(f"{call} {', '.join(map(describe_tensor, tensors))}", (*same, _shapes(tensors)))
        return self._run(kind, fp, lambda: gloo_call(hosts(staged)), staged, tensors, _nbytes(tensors))

    def _reduce_in_place(self, kind: str, call: str, tensors: list[torch.Tensor], same: tuple, red: Reduction,
                         gloo_call: Callable[[list[torch.Tensor]], Any], results_here: bool = True) -> _StagedWork:
        """A reduction that rewrites ``tensors`` with its result (all-reduce; reduce on the root).

        An op gloo lacks runs on new tensors: each tensor's contribution (:meth:`Reduction.before`,
        on its device: times the factor, or a copy) is staged, gloo sums the contributions, and
        the result (:meth:`Reduction.after`) is written into ``tensors`` where ``results_here``:
        a reduce's other ranks keep their tensors as they were, as with NCCL.
        """
        if red.plain:
            return self._in_place(kind, call, tensors, same, gloo_call)
        contributions = []
        for tensor in tensors:
            contribution = red.before(tensor)
            contributions.append(tensor.detach().clone() if contribution is tensor else contribution)
        staged = [self._stage(c, True, in_place=True) for c in contributions]
        fp = Fingerprint(f"{call} {', '.join(map(describe_tensor, tensors))}", (*same, _shapes(tensors)))

        def results() -> None:
            if results_here:
                for tensor, contribution in zip(tensors, contributions):
                    assign(tensor, red.after(contribution))

        return self._run(kind, fp, lambda: gloo_call(hosts(staged)), staged, tensors, _nbytes(tensors), after=results)

    @staticmethod
    def _finish_outputs(red: Reduction, outputs: Sequence[torch.Tensor]) -> Callable[[], None] | None:
        """The last step of an out-of-place reduction on its outputs (integer AVG's division)."""
        if red.plain:
            return None

        def results() -> None:
            for out in outputs:
                value = red.after(out)
                if value is not out:
                    assign(out, value)

        return results

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> _StagedWork:
        opts = opts if opts is not None else dist.AllreduceOptions()
        red = self._reduction("all_reduce", opts.reduceOp, tensors)
        return self._reduce_in_place("all_reduce", f"all_reduce({red.label})", tensors, ("all_reduce", red.name), red,
                                     lambda hosts: self._gloo.allreduce(hosts, red.gloo_options(opts)))

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> _StagedWork:
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        red = self._reduction("all_reduce_coalesced", opts.reduceOp, tensors)
        return self._reduce_in_place("all_reduce", f"all_reduce_coalesced({red.label})", tensors,
                                     ("all_reduce_coalesced", red.name), red,
                                     lambda hosts: self._gloo.allreduce_coalesced(hosts, red.gloo_options(opts)))

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> _StagedWork:
        opts = opts if opts is not None else dist.ReduceOptions()
        red = self._reduction("reduce", opts.reduceOp, tensors)
        return self._reduce_in_place("reduce", f"reduce({red.label}, dst={opts.rootRank})", tensors,
                                     ("reduce", red.name, opts.rootRank), red,
                                     lambda hosts: self._gloo.reduce(hosts, red.gloo_options(opts)),
                                     results_here=self.rank() == opts.rootRank)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> _StagedWork:
        opts = opts if opts is not None else dist.BroadcastOptions()
        return self._in_place("broadcast", f"broadcast(src={opts.rootRank})", tensors, ("broadcast", opts.rootRank),
                              lambda hosts: self._gloo.broadcast(hosts, opts))

    # -- gathers and scatters --------------------------------------------------------------------

    def allgather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> _StagedWork:
        problem = next((p for outs, inp in zip(output_lists, inputs)
                        if (p := self._per_rank_problem("output list", outs, inp))), None)
        fp = Fingerprint(f"all_gather {', '.join(map(describe_tensor, inputs))}",
                         ("all_gather", _shapes(inputs)), problem=problem)
        staged_in = self._inputs(inputs)
        staged_out = [self._outputs(outs) for outs in output_lists]
        return self._run(
            "all_gather", fp,
            lambda: self._gloo.allgather([hosts(s) for s in staged_out], hosts(staged_in)),
            [s for outs in staged_out for s in outs], output_lists, _nbytes(inputs) * self.size(),
        )

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> _StagedWork:
        problem = None
        if output.numel() != input.numel() * self.size() or output.dtype != input.dtype:
            problem = (f"the output is {describe_tensor(output)}; all_gather_into_tensor needs "
                       f"{self.size()} x {describe_tensor(input)} elements of the input's dtype")
        fp = Fingerprint(f"all_gather_into_tensor {describe_tensor(input)} -> {describe_tensor(output)}",
                         ("all_gather_single", dtype_code(input.dtype), input.numel()), problem=problem)
        staged_in, staged_out = self._stage(input, True), self._stage(output, False)
        return self._run("all_gather", fp, lambda: self._gloo._allgather_base(staged_out.host, staged_in.host),
                         [staged_out], [output], _nbytes([output]))

    _allgather_base = all_gather_single

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> _StagedWork:
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return _Combined(works, outputs)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def reduce_scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any = None) -> _StagedWork:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        red = self._reduction("reduce_scatter", opts.reduceOp, [t for ins in input_lists for t in ins])
        problem = None
        for out, ins in zip(outputs, input_lists):
            if len(ins) != self.size():
                problem = f"the input list has {len(ins)} tensors; the group has {self.size()} ranks"
            elif ins[self.rank()].numel() != out.numel() or any(t.dtype != out.dtype for t in ins):
                problem = f"the output {describe_tensor(out)} does not fit this rank's input {describe_tensor(ins[self.rank()])}"
        fp = Fingerprint(f"reduce_scatter({red.label}) inputs {[list(map(describe_tensor, ins)) for ins in input_lists]}",
                         ("reduce_scatter", red.name, tuple(_shapes(ins) for ins in input_lists)), problem=problem)
        staged_out = self._outputs(outputs)
        staged_in = [self._inputs([red.before(t) for t in ins]) for ins in input_lists]
        return self._run(
            "reduce_scatter", fp,
            lambda: self._gloo.reduce_scatter(hosts(staged_out), [hosts(s) for s in staged_in], red.gloo_options(opts)),
            staged_out, outputs, sum(_nbytes(ins) for ins in input_lists), after=self._finish_outputs(red, outputs),
        )

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> _StagedWork:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        red = self._reduction("reduce_scatter_tensor", opts.reduceOp, [input])
        problem = None
        if input.numel() != output.numel() * self.size() or output.dtype != input.dtype:
            problem = (f"the input is {describe_tensor(input)}; reduce_scatter_tensor needs "
                       f"{self.size()} x {describe_tensor(output)} elements of the output's dtype")
        fp = Fingerprint(f"reduce_scatter_tensor({red.label}) {describe_tensor(input)} -> {describe_tensor(output)}",
                         ("reduce_scatter_single", red.name, dtype_code(input.dtype), input.numel()), problem=problem)
        staged_in, staged_out = self._stage(red.before(input), True), self._stage(output, False)
        return self._run("reduce_scatter", fp,
                         lambda: self._gloo._reduce_scatter_base(staged_out.host, staged_in.host,
                                                                 red.gloo_options(opts)),
                         [staged_out], [output], _nbytes([input]), after=self._finish_outputs(red, [output]))

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> _StagedWork:
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return _Combined(works, outputs)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def gather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> _StagedWork:
        opts = opts if opts is not None else dist.GatherOptions()
        root = opts.rootRank
        problem = None
        if self.rank() == root:
            problem = self._per_rank_problem("gather list", output_lists[0] if output_lists else [], inputs[0])
        fp = Fingerprint(f"gather(dst={root}) {', '.join(map(describe_tensor, inputs))}",
                         ("gather", root, _shapes(inputs)), problem=problem)
        staged_in = self._inputs(inputs)
        staged_out = [self._outputs(outs) for outs in output_lists]
        return self._run(
            "gather", fp, lambda: self._gloo.gather([hosts(s) for s in staged_out], hosts(staged_in), opts),
            [s for outs in staged_out for s in outs], output_lists, _nbytes(inputs) * self.size(),
        )

    def scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any = None) -> _StagedWork:
        opts = opts if opts is not None else dist.ScatterOptions()
        root = opts.rootRank
        problem = None
        if self.rank() == root:
            problem = self._per_rank_problem("scatter list", input_lists[0] if input_lists else [], outputs[0])
        fp = Fingerprint(f"scatter(src={root}) {', '.join(map(describe_tensor, outputs))}",
                         ("scatter", root, _shapes(outputs)), problem=problem)
        staged_out = self._outputs(outputs)
        staged_in = [self._inputs(ins) for ins in input_lists]
        return self._run(
            "scatter", fp, lambda: self._gloo.scatter(hosts(staged_out), [hosts(s) for s in staged_in], opts),
            staged_out, outputs, _nbytes(outputs) * self.size(),
        )

    # -- all-to-all ------------------------------------------------------------------------------

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                      input_split_sizes: list[int], opts: Any = None) -> _StagedWork:
        world = self.size()
        problem = None
        in_splits, out_splits = list(input_split_sizes), list(output_split_sizes)
        if not in_splits:
            if input.shape[0] % world if input.dim() else True:
                problem = f"input {describe_tensor(input)}: dim 0 must divide by {world} without input_split_sizes"
            in_splits = [input.shape[0] // world if input.dim() else 0] * world
        if not out_splits:
            if output.shape[0] % world if output.dim() else True:
                problem = f"output {describe_tensor(output)}: dim 0 must divide by {world} without output_split_sizes"
            out_splits = [output.shape[0] // world if output.dim() else 0] * world
        row_in = input[0].numel() if input.dim() and input.shape[0] else (input.numel() and 1)
        row_out = output[0].numel() if output.dim() and output.shape[0] else (output.numel() and 1)
        if not problem and (sum(in_splits) != (input.shape[0] if input.dim() else 0)
                            or sum(out_splits) != (output.shape[0] if output.dim() else 0)):
            problem = (f"splits {in_splits} (input) / {out_splits} (output) do not add up to dim 0 of "
                       f"{describe_tensor(input)} / {describe_tensor(output)}")
        fp = Fingerprint(
            f"all_to_all_single {describe_tensor(input)} splits {in_splits} -> {describe_tensor(output)} splits {out_splits}",
            ("all_to_all", dtype_code(input.dtype), dtype_code(output.dtype)),
            sends=[s * row_in for s in in_splits], receives=[s * row_out for s in out_splits], problem=problem,
        )
        staged_in, staged_out = self._stage(input, True), self._stage(output, False)
        return self._run(
            "all_to_all", fp,
            lambda: self._gloo.alltoall_base(staged_out.host, staged_in.host, list(output_split_sizes),
                                             list(input_split_sizes), opts or dist.AllToAllOptions()),
            [staged_out], output, _nbytes([input]),
        )

    all_to_all_single = alltoall_base

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> _StagedWork:
        """Sizes may differ per peer (gloo's own list all-to-all refuses that): the tensors travel
        as one flat all-to-all with per-peer element counts."""
        world = self.size()
        problem = None
        if len(outputs) != world or len(inputs) != world:
            problem = f"all_to_all needs {world} input and {world} output tensors, got {len(inputs)} and {len(outputs)}"
        elif len({t.dtype for t in (*inputs, *outputs)}) > 1:
            problem = "all_to_all needs one dtype for every input and output tensor"
        fp = Fingerprint(
            f"all_to_all {[describe_tensor(t) for t in inputs]} -> {[describe_tensor(t) for t in outputs]}",
            ("all_to_all_list", tuple(dtype_code(t.dtype) for t in inputs[:1])),
            sends=[] if problem else [t.numel() for t in inputs],
            receives=[] if problem else [t.numel() for t in outputs], problem=problem,
        )
        self._agree("all_to_all", fp)
        sends, receives = [t.numel() for t in inputs], [t.numel() for t in outputs]
        flat_in = torch.cat([t.detach().to("cpu").reshape(-1) for t in inputs])
        flat_out = torch.empty(sum(receives), dtype=flat_in.dtype)
        started = time.perf_counter()
        with self.failure("all_to_all"):
            pending = self._gloo.alltoall_base(flat_out, flat_in, receives, sends, dist.AllToAllOptions())

        def finish() -> list[torch.Tensor]:
            for out, part in zip(outputs, flat_out.split(receives)):
                Staged(out, False, host=part.view(out.shape)).write_back()
            return outputs

        work = _StagedWork(self, "all_to_all", [pending], finish, _nbytes(inputs), started)
        if self._coalescing is not None:
            self._coalescing.append(work)
        return work

    # -- point to point --------------------------------------------------------------------------

    @staticmethod
    def _header(tensor: torch.Tensor) -> torch.Tensor:
        return torch.tensor([tensor.numel(), dtype_code(tensor.dtype)], dtype=torch.int64)

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> _StagedWork:
        """Sends a two-number header (elements, dtype) before the payload, so the receiver can
        refuse a tensor that does not fit instead of gloo aborting it."""
        (tensor,) = tensors
        staged = self._stage(tensor, True)
        self._claim_staged()
        staged.fill()
        header = self._header(tensor)
        started = time.perf_counter()
        with self.failure("send"):
            pending = [self._gloo.send([header], dst, tag), self._gloo.send([staged.host], dst, tag)]

        def finish() -> list[torch.Tensor]:
            staged.release()
            return tensors

        work = _StagedWork(self, "send", pending, finish, _nbytes(tensors), started)
        work._keep = header
        if self._coalescing is not None:
            self._coalescing.append(work)
        return work

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> _StagedWork:
        return self._receive(tensors, src, tag)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> _StagedWork:
        return self._receive(tensors, None, tag)

    def _receive(self, tensors: list[torch.Tensor], src: int | None, tag: int) -> _StagedWork:
        """The header, then the payload, are received by a helper thread that touches only host
        buffers (so the payload's receive is posted as soon as the header arrives, as gloo posts
        it at once: ``isend``/``irecv`` pairs waited in any order cannot deadlock); ``wait()``
        then writes the tensor on the calling thread."""
        (tensor,) = tensors
        staged = self._stage(tensor, False)
        self._claim_staged()
        expected = self._header(tensor).tolist()
        started = time.perf_counter()

        def receive() -> tuple[int, str | None]:
            header = torch.empty(2, dtype=torch.int64)
            first = self._gloo.recv([header], src, tag) if src is not None else self._gloo.recv_anysource([header], tag)
            first.wait()
            source = src if src is not None else first.source_rank()
            numel, code = header.tolist()
            fits = [numel, code] == expected
            target = staged.host if fits else torch.empty(int(numel), dtype=_dtype(code))
            self._gloo.recv([target], source, tag).wait()
            if fits:
                return source, None
            return source, (
                f"recv on process group {self._name!r}: rank {source} sent {numel} elements of "
                f"{_dtype_name(code)}, but this rank (rank {self.rank()}) receives into "
                f"{describe_tensor(tensor)}; the message was received and dropped, the tensor is unchanged"
            )

        background = _Background(receive)
        work: _StagedWork

        def finish() -> list[torch.Tensor]:
            work._source, problem = background.result
            if problem:
                staged.release()
                raise CollectiveMismatchError(problem)
            staged.write_back()
            staged.release()
            return tensors

        work = _StagedWork(self, "recv", [background], finish, _nbytes(tensors), started)
        if self._coalescing is not None:
            self._coalescing.append(work)
        return work

    # -- synchronisation -------------------------------------------------------------------------

    def barrier(self, opts: Any = None) -> _StagedWork:
        return self._run("barrier", Fingerprint("barrier", ("barrier",)), lambda: self._gloo.barrier(), [], [], 0)

    def start_coalescing(self, device: torch.device) -> None:
        """Collectives until :meth:`end_coalescing` complete together (``batch_isend_irecv``)."""
        self._coalescing = []

    def end_coalescing(self, device: torch.device) -> dist._Work:
        works, self._coalescing = self._coalescing or [], None
        return _Combined(works, None)

    def _start_coalescing(self, device: torch.device) -> None:
        self.start_coalescing(device)

    def _end_coalescing(self, device: torch.device) -> dist._Work:
        return self.end_coalescing(device)


class _Background:
    """A host-only function run on a daemon thread; ``wait()`` joins it and re-raises."""

    def __init__(self, fn: Callable[[], Any]):
        self.result: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True, name="accelkit-recv")
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.result = fn()
        except BaseException as exc:  # handed to the waiting thread
            self._error = exc

    def wait(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error


class _Combined(dist._Work):
    """Several works that complete together."""

    def __init__(self, works: list[dist._Work], result: Any):
        super().__init__()
        self._works, self._result = works, result
        self._future: torch.futures.Future = torch.futures.Future()

    def wait(self, timeout: timedelta | None = None) -> bool:
        if not self._future.done():
            for work in self._works:
                work.wait()
            self._future.set_result(self._result)
        return True

    def get_future(self) -> torch.futures.Future:
        self.wait()
        return self._future

    def is_completed(self) -> bool:
        return self._future.done()

    def is_success(self) -> bool:
        return self._future.done()


@functools.cache
def _warn_checks_through_gloo() -> None:
    warnings.warn(
        f"accelkit: the ranks of a process group could not open connections to each other, so its "
        f"agreement checks go through gloo (about 0.2 ms more per collective on loopback). If the "
        f"network allows only gloo's connections, set {CHECKS_ENV}=gloo to skip the attempt.",
        RuntimeWarning, stacklevel=3)


def _dtype(code: int) -> torch.dtype:
    return DTYPE_CODES[code] if 0 <= code < len(DTYPE_CODES) else torch.uint8


def _dtype_name(code: int) -> str:
    return str(_dtype(code)).removeprefix("torch.")
