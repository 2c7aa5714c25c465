"""torch.compile(backend="neuron"): each AOTAutograd graph as one program of the eager tile
kernels, compared with eager neuron (bit for bit: the same kernels in the same order) and with
CPU PyTorch (float32 tolerance). The fallback policy is ``deny`` throughout: nothing may be split
out of a program and run eagerly.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
import torch._dynamo
from torch import nn

import accelkit
from accelkit_backends.neuron.graph_lowering import NeuronGraphLowering, NeuronStaticShapeError


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    with accelkit.fallback_policy("deny"):
        yield


def train(model, x, y, steps=3, compiled=False):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    forward = torch.compile(model, backend="neuron") if compiled else model
    losses = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(forward(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.layer(x).mean(1))


MODELS = {
    "mlp": (lambda: nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)),
            lambda g: (torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g))),
    "cnn": (lambda: nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                                  nn.Flatten(), nn.Linear(8 * 4 * 4, 5)),
            lambda g: (torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 5, (4,), generator=g))),
    "encoder": (Encoder, lambda g: (torch.randn(2, 5, 16, generator=g), torch.randint(0, 3, (2,), generator=g))),
}


@pytest.mark.parametrize("name", MODELS)
def test_a_model_trains_under_compile_as_eager_neuron_and_the_cpu_do(dev, name):
    make_model, make_batch = MODELS[name]
    torch.manual_seed(0)
    model = make_model()
    x, y = make_batch(torch.Generator().manual_seed(1))
    cpu_model, eager_model, compiled_model = model, copy.deepcopy(model).to(dev), copy.deepcopy(model).to(dev)
    cpu_losses = train(cpu_model, x, y)
    eager_losses = train(eager_model, x.to(dev), y.to(dev))
    compiled_losses = train(compiled_model, x.to(dev), y.to(dev), compiled=True)
    assert compiled_losses == eager_losses  # the same kernels in the same order
    assert compiled_losses == pytest.approx(cpu_losses, rel=1e-5, abs=1e-6)
    for (key, want), (_, eager), (_, got) in zip(cpu_model.state_dict().items(), eager_model.state_dict().items(),
                                                 compiled_model.state_dict().items()):
        assert torch.equal(got.cpu(), eager.cpu()), key
        torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-5, msg=lambda m: f"{key}: {m}")
    stats = accelkit.stats()["compile"]
    assert stats["programs_compiled"] >= 2 and stats["aot_graphs"] == {"forward": 1, "backward": 1}, stats
    assert stats["eager_nodes"] == {} and stats["graph_breaks"] == 0, stats


def test_a_new_shape_is_a_new_program_and_the_same_shape_reuses_it(dev):
    double = torch.compile(lambda t: (t * 2).relu(), backend="neuron", dynamic=False)
    double(torch.ones(3, device=dev))
    built = accelkit.stats()["compile"]["programs_compiled"]
    assert torch.equal(double(torch.full((3,), -1.0, device=dev)).cpu(), torch.zeros(3))
    assert accelkit.stats()["compile"]["programs_compiled"] == built
    assert torch.equal(double(torch.ones(5, device=dev)).cpu(), torch.full((5,), 2.0))
    assert accelkit.stats()["compile"]["programs_compiled"] > built


def test_a_shape_change_without_dynamic_compiles_one_program_per_shape(dev):
    # Dynamo's default turns a graph dynamic after a shape changes; neuron then builds one
    # program per concrete shape, as neuronx-cc builds one NEFF per shape.
    weight = torch.randn(4, 4)
    project = torch.compile(lambda x, w: (x @ w).relu(), backend="neuron")
    built = []
    for rows in (3, 5, 7, 5):
        x = torch.randn(rows, 4)
        got = project(x.to(dev), weight.to(dev)).cpu()
        torch.testing.assert_close(got, (x @ weight).relu())
        built.append(accelkit.stats()["compile"]["programs_compiled"])
    assert built == [1, 2, 3, 3], built
    assert accelkit.stats()["compile"]["eager_nodes"] == {}


def test_dynamic_shapes_are_refused_with_the_static_shape_rule_and_the_way_round(dev):
    scaled = torch.compile(lambda t: t * 2, backend="neuron", dynamic=True)
    with pytest.raises(Exception, match="neuronx-cc compiles static shapes only") as refused:
        scaled(torch.ones(3, device=dev))
    assert NeuronStaticShapeError.__name__ in str(refused.value) and "accelkit.bucketed" in str(refused.value)


@pytest.fixture
def symbolic_graphs(monkeypatch):
    """Per graph the neuron compiler is given, whether it has symbolic sizes (the tests below
    need Dynamo to have made graphs dynamic by itself, or they test nothing)."""
    seen = []
    lower = NeuronGraphLowering.lower

    def spy(self, graph, random_nodes):
        vals = [node.meta.get("val") for node in graph.graph.nodes if node.op == "placeholder"]
        sizes = [size for val in vals for size in (val.shape if isinstance(val, torch.Tensor) else (val,))]
        seen.append(any(isinstance(size, torch.SymInt) for size in sizes))
        return lower(self, graph, random_nodes)

    monkeypatch.setattr(NeuronGraphLowering, "lower", spy)
    return seen


def test_an_mlp_a_cnn_and_an_encoder_layer_compiled_in_one_process_give_eager_results(dev, symbolic_graphs):
    # One Dynamo cache for the three models (no reset between them): the recompiles make Dynamo
    # turn the later graphs dynamic by itself, and their factories (zeros_like, full_like in the
    # backward) must take their shapes from the call, not from the graph's symbolic sizes.
    layer = functools.partial(nn.TransformerEncoderLayer, 16, 2, 32, dropout=0.0, batch_first=True)
    for make_model, shape in ((MODELS["mlp"][0], (8, 16)), (MODELS["cnn"][0], (4, 3, 8, 8)), (layer, (2, 5, 16))):
        torch.manual_seed(0)
        eager = make_model().to(dev)
        compiled_model = copy.deepcopy(eager)
        compiled = torch.compile(compiled_model, backend="neuron")
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).to(dev)
        want, got = eager(x), compiled(x)
        want.square().mean().backward()
        got.square().mean().backward()
        assert torch.equal(got.cpu(), want.cpu())
        for (name, p_eager), p_compiled in zip(eager.named_parameters(), compiled_model.parameters()):
            assert torch.equal(p_compiled.grad.cpu(), p_eager.grad.cpu()), name
    stats = accelkit.stats()["compile"]
    assert stats["aot_graphs"] == {"forward": 3, "backward": 3} and stats["eager_nodes"] == {}, stats
    assert sum(symbolic_graphs) >= 2, symbolic_graphs  # the CNN's and the layer's graphs at least


def _shaped_by_the_call(x, w):
    # Factories sized by a symbolic size or shaped like a tensor, a contiguous copy, views and an
    # expand with symbolic sizes, and an elementwise chain fed by a matmul (fused).
    n = x.shape[0]
    h = (x @ w).relu() * 2 + 1
    rows = torch.arange(n, device=x.device, dtype=x.dtype).unsqueeze(1)
    filled = torch.zeros_like(h) + torch.full_like(h, 0.5) + h.new_ones(n, 1)
    flat = (h + rows + filled).t().contiguous().reshape(-1)
    return flat.expand(2, -1).reshape(2, n, -1).sum(0).sigmoid()


def _run_shaped(dev, rows, compiled, mark_dynamic=False):
    g = torch.Generator().manual_seed(rows)
    x, w = torch.randn(rows, 8, generator=g), torch.randn(8, 8, generator=g)
    x, w = x.to(dev).requires_grad_(), w.to(dev).requires_grad_()
    if mark_dynamic:
        torch._dynamo.mark_dynamic(x, 0)
    out = compiled(x, w)
    out.square().sum().backward()
    return out.detach().cpu(), x.grad.cpu(), w.grad.cpu()


def _programs(per_program):
    """The compiled programs' kernels, HBM bytes and bytes kept on chip, sorted (the estimate
    orders programs by label, whose graph numbers differ between runs). Adaptive eager's region
    programs (the eager ops around the compiled call) are not the compiled graph's."""
    return sorted((e["kernels"], e["hbm_bytes"], e["kept_bytes"], e["calls"])
                  for label, e in per_program.items() if not label.startswith("eager region"))


def test_a_graph_dynamo_made_dynamic_runs_one_program_per_shape_as_a_static_graph_would(dev, symbolic_graphs):
    compiled = torch.compile(_shaped_by_the_call, backend="neuron")
    built, programs = [], {}
    for rows, mark in ((3, True), (5, False), (3, False), (5, False)):
        accelkit.reset_stats()
        got = _run_shaped(dev, rows, compiled, mark_dynamic=mark)
        want = _run_shaped(dev, rows, _shaped_by_the_call)
        for g, w in zip(got, want):
            assert g.shape == w.shape and torch.equal(g, w)
        built.append(accelkit.stats()["compile"]["programs_compiled"])
        programs.setdefault(rows, _programs(accelkit.stats()["neuron"]["estimate"]["per_program"]))
    assert symbolic_graphs == [True, True]  # one forward and one backward graph, both dynamic
    assert built == [2, 2, 0, 0], built  # a forward and a backward program per new shape
    assert accelkit.stats()["compile"]["eager_nodes"] == {}

    # Each shape's programs are those of a static graph of that shape: fused alike, same traffic.
    for rows, dynamic in programs.items():
        torch._dynamo.reset()
        accelkit.reset_stats()
        _run_shaped(dev, rows, torch.compile(_shaped_by_the_call, backend="neuron", dynamic=False))
        assert _programs(accelkit.stats()["neuron"]["estimate"]["per_program"]) == dynamic, rows
    assert symbolic_graphs[2:] == [False, False, False, False]


def test_bucketing_compiles_one_program_for_lengths_in_one_bucket(dev):
    model = torch.compile(lambda ids: (ids * 3).sum(-1), backend="neuron")
    run = accelkit.bucketed(model, (8, 16), mask=None)
    first = run(torch.arange(5, device=dev).reshape(1, 5).float())
    built = accelkit.stats()["compile"]["programs_compiled"]
    second = run(torch.arange(7, device=dev).reshape(1, 7).float())
    assert accelkit.stats()["compile"]["programs_compiled"] == built
    assert torch.equal(first.cpu(), torch.tensor([30.0])) and torch.equal(second.cpu(), torch.tensor([63.0]))


def test_dropout_under_compile_follows_the_device_seed_and_differentiates(dev):
    model = torch.compile(nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5)).to(dev), backend="neuron")
    x = torch.ones(16, 8, device=dev, requires_grad=True)
    torch.manual_seed(1)
    first = model(x)
    torch.manual_seed(1)
    again = model(x)
    other = model(x)
    assert torch.equal(first.cpu(), again.cpu()) and not torch.equal(first.cpu(), other.cpu())
    assert 0.2 < (first == 0).float().mean().item() < 0.8
    first.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape


# -- fusion --------------------------------------------------------------------------------------


def _chain(x, y):
    a = torch.relu(x * 2 + y)
    b = torch.where(a > 0.5, a, y * 3)
    return torch.sigmoid(b) - x, a.sum()


def _fused_kernels() -> dict[str, int]:
    return {name: n for name, n in accelkit.stats()["neuron"]["instances"].items() if name.startswith("fused(")}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_elementwise_chain_is_one_program_with_the_eager_results_and_less_hbm_traffic(dev, dtype):
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randn(64, 300, generator=g).to(dtype).to(dev) for _ in range(2))
    accelkit.reset_stats()
    eager = _chain(x, y)
    eager_bytes = accelkit.stats()["neuron"]["estimate"]["hbm_bytes"]
    accelkit.reset_stats()
    compiled = torch.compile(_chain, backend="neuron")(x, y)
    estimate = accelkit.stats()["neuron"]["estimate"]
    for want, got in zip(eager, compiled):
        assert got.dtype == want.dtype and torch.equal(got.cpu(), want.cpu())  # bit for bit
    fused = _fused_kernels()
    assert list(fused) == ["fused(mul.Tensor+add.Tensor+relu.default+gt.Scalar+mul.Tensor+where.self+"
                           "sigmoid.default+sub.Tensor)"], fused
    assert estimate["kernels"] == 2  # the fused chain and the sum
    # The chain: x and y in, relu's result (summed after it) and the output out; the sum reads
    # relu's result once more. No other intermediate touches HBM.
    assert estimate["hbm_bytes"] <= 5 * x.numel() * x.element_size() + 16
    assert estimate["hbm_bytes"] < 0.5 * eager_bytes


def _casts(x, y):
    return (x.float() * y).to(torch.bfloat16) + 1, x.float().to(torch.float16)


def test_casts_run_inside_the_elementwise_chain_around_them_with_the_eager_results(dev):
    """Autocast's casts between ops (``_to_copy`` of the dtype only) fuse as any elementwise op:
    what neuronx-cc does with them, instead of a program per cast."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 300, generator=g).to(torch.bfloat16).to(dev)
    y = torch.randn(64, 300, generator=g).to(dev)
    eager = _casts(x, y)
    accelkit.reset_stats()
    compiled = torch.compile(_casts, backend="neuron")(x, y)
    for want, got in zip(eager, compiled):
        assert got.dtype == want.dtype and torch.equal(got.cpu(), want.cpu())  # bit for bit
    (name,) = _fused_kernels()
    assert name.count("_to_copy.default") == 4 and accelkit.stats()["neuron"]["estimate"]["kernels"] == 1, name


def test_a_matmul_feeds_its_activation_and_relu_backward_from_sbuf(dev):
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(dev)
    x, y = torch.randn(8, 16, device=dev), torch.randint(0, 4, (8,), device=dev)
    accelkit.reset_stats()
    train(model, x, y, steps=1, compiled=True)
    # Forward: bias and ReLU on each result block before it is stored. Backward: the input
    # gradient's matmul feeds ReLU's mask (le, a constant, where) though other nodes sit between.
    assert set(_fused_kernels()) == {"fused(addmm.default+relu.default)", "fused(mm.default+le.Scalar+where.self)"}


def _matmul_tails(x, w, b):
    y = torch.addmm(b, x, w)
    z = x @ w  # read by the fused tail and by amax: stored as well
    return torch.nn.functional.gelu(y) * 2 - 1, y.sum(), torch.sigmoid(z), z.amax(dim=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_matmul_with_an_elementwise_tail_is_one_program_with_the_eager_results(dev, dtype):
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(*shape, generator=g).to(dtype).to(dev) for shape in ((200, 96), (96, 600), (600,)))
    eager = _matmul_tails(x, w, b)
    accelkit.reset_stats()
    compiled = torch.compile(_matmul_tails, backend="neuron")(x, w, b)
    for want, got in zip(eager, compiled):
        assert got.dtype == want.dtype and torch.equal(got.cpu(), want.cpu())  # bit for bit
    # Every elementwise op runs in a program that takes a matmul's result blocks from SBUF.
    fused = _fused_kernels()
    assert fused and all(name.startswith(("fused(mm.default+", "fused(addmm.default+")) for name in fused), fused
    assert sum(name.count("+") for name in fused) == 4, fused  # gelu, mul, sub, sigmoid


def _scaled_readers(a, x, p):
    grad = torch.mm(a.t(), x)  # a matmul whose result is returned and fed to a tail
    doubled = x * 2.0
    return grad, torch.add(p, grad, alpha=-0.1), torch.add(x, doubled, alpha=0.5), doubled + 1.0


def test_an_add_with_alpha_in_a_fused_program_leaves_its_scaled_operand_as_it_was(dev):
    # An SGD update reads the weight gradient (p - lr * grad) that is also a result: the scaled
    # operand is a fused program's value (a matmul block still to be stored, an intermediate
    # another op reads), so the scaling must not overwrite it.
    g = torch.Generator().manual_seed(0)
    a, x, p = (torch.randn(*shape, generator=g).to(dev) for shape in ((8, 32), (8, 16), (32, 16)))
    eager = _scaled_readers(a, x, p)
    accelkit.reset_stats()
    compiled = torch.compile(_scaled_readers, backend="neuron")(a, x, p)
    assert any(name.startswith("fused(mm.default+") for name in _fused_kernels()), _fused_kernels()
    for want, got in zip(eager, compiled):
        assert torch.equal(got.cpu(), want.cpu())  # bit for bit


def _long_chain(x, steps=24):  # 24 steps, 60 ops: too many buffers for SBUF even with narrow chunks
    for i in range(steps):
        x = torch.sigmoid(x * 1.5 + i) if i % 2 else torch.tanh(x - 0.25)
    return x


def _compile_and_compare(dev, fn):
    """``fn`` on a large tensor, compiled and eager (bit for bit equal); the compiled run's
    kernel calls by name."""
    x = torch.randn(4, 128, 2048).to(dev)  # 2048-element chunks: a few operands fill SBUF
    eager = fn(x)
    accelkit.reset_stats()
    compiled = torch.compile(fn, backend="neuron")(x)
    assert torch.equal(compiled.cpu(), eager.cpu())
    return {name: op["calls"] for name, op in accelkit.stats()["neuron"]["estimate"]["per_op"].items()}


def test_a_long_chain_on_a_large_tensor_streams_narrower_chunks_as_one_program(dev):
    # 30 ops: 2048-element chunks would need 31 x 24 KiB of SBUF.
    runs = _compile_and_compare(dev, lambda x: _long_chain(x, steps=12))
    (name,) = _fused_kernels()
    assert name.count("+") == 29 and runs == {name: 1}
    assert accelkit.stats()["neuron"]["estimate"]["hbm_bytes"] == 2 * 4 * 128 * 2048 * 4  # in once, out once


def test_a_chain_too_large_for_sbuf_is_split_into_programs_that_fit(dev):
    runs = _compile_and_compare(dev, _long_chain)
    assert set(runs) == set(_fused_kernels()) and sum(runs.values()) >= 2, runs  # only fused programs
    assert sum((name.count("+") + 1) * calls for name, calls in runs.items()) == 60  # each op once


def test_a_group_that_overflows_sbuf_at_run_time_is_halved_with_the_same_results(dev, monkeypatch):
    from accelkit_backends.neuron import fusion

    monkeypatch.setattr(fusion, "SBUF_SHARE", 100.0)  # the planner lets the whole chain through
    runs = _compile_and_compare(dev, _long_chain)
    assert sum(runs.values()) >= 2 and sum((name.count("+") + 1) * calls for name, calls in runs.items()) == 60


def _two_branches(x, w1, w2):
    return torch.relu(x @ w1) + torch.sigmoid(x @ w2)


def test_a_compiled_graph_overlaps_its_kernels_and_its_schedule_is_the_profiled_one(dev):
    from accelkit_backends.neuron import profile

    g = torch.Generator().manual_seed(0)
    x, w1, w2 = (torch.randn(64, 128, generator=g).to(dev), torch.randn(128, 96, generator=g).to(dev),
                 torch.randn(128, 96, generator=g).to(dev))
    accelkit.reset_stats()
    eager = _two_branches(x, w1, w2)
    eager_seconds = accelkit.stats()["neuron"]["estimate"]["device_seconds"]
    compiled_fn = torch.compile(_two_branches, backend="neuron")
    compiled_fn(x, w1, w2)  # compiles; the program's schedule is computed here
    accelkit.reset_stats()
    compiled = compiled_fn(x, w1, w2)  # reuses it
    estimate = accelkit.stats()["neuron"]["estimate"]
    assert torch.equal(compiled.cpu(), eager.cpu())
    spans = sum(op["seconds"] for op in estimate["per_op"].values())
    assert estimate["device_seconds"] < spans  # the second matmul runs under the first's tail
    assert estimate["device_seconds"] < eager_seconds
    (label, program), = estimate["per_program"].items()
    assert label.startswith("graph ") and program["calls"] == 1 and program["kernels"] == estimate["kernels"]
    assert program["seconds"] == pytest.approx(estimate["device_seconds"], rel=1e-12)
    assert program["hbm_bytes"] == estimate["hbm_bytes"]
    with profile() as prof:
        compiled_fn(x, w1, w2)
    assert prof.device_seconds == pytest.approx(estimate["device_seconds"], rel=1e-9)
    assert any(k.name.startswith("fused(") for k in prof.kernels)  # relu, sigmoid and add: one program
    events = [e for e in prof.trace_events() if e.get("cat") == "program"]
    assert [e["name"] for e in events] == [label]
    assert events[0]["dur"] == pytest.approx(estimate["device_seconds"] * 1e6, rel=1e-9)


def test_a_compiled_optimizer_step_runs_its_foreach_ops_as_one_program_with_eager_results(dev):
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    x, y = torch.randn(8, 16, device=dev), torch.randint(0, 4, (8,), device=dev)
    params = {}
    for mode in ("eager", "compiled"):
        torch._dynamo.reset()
        model = copy.deepcopy(base).to(dev)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        step = torch.compile(optimizer.step, backend="neuron") if mode == "compiled" else optimizer.step
        for _ in range(3):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            step()
        params[mode] = [p.detach().cpu() for p in model.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(params["eager"], params["compiled"]))
    stats = accelkit.stats()["compile"]
    assert stats["eager_nodes"] == {} and stats["program_calls"] >= 3, stats


def test_a_bfloat16_encoder_trains_under_compile_where_a_kernel_hands_over_another_layout(dev):
    # In bfloat16 AOTAutograd's graph views an attention result whose layout the kernel chose
    # differently from PyTorch's (same values): the view gets a row-major copy first.
    torch.manual_seed(0)
    model = Encoder().to(dev, torch.bfloat16)
    x = torch.randn(2, 5, 16).to(dev, torch.bfloat16)
    y = torch.randint(0, 3, (2,), device=dev)
    eager_model = copy.deepcopy(model)
    eager = train(eager_model, x, y, steps=2)
    accelkit.reset_stats()
    compiled = train(model, x, y, steps=2, compiled=True)
    assert compiled == pytest.approx(eager, rel=2e-2)
    assert "layout_copy" in accelkit.stats()["neuron"]["estimate"]["per_op"]


def test_a_whole_training_step_compiles_to_one_program_with_the_eager_results(dev):
    # torch.func's grad inside the compiled function: forward, backward (seeded by full_like,
    # a factory shaped like its argument) and the update are one graph, so one program.
    from torch.func import functional_call, grad_and_value

    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))

    def run(device, compiled):
        torch._dynamo.reset()
        model = copy.deepcopy(base).to(device)
        params = {k: v.detach() for k, v in model.named_parameters()}

        def loss_of(p, x, y):
            return nn.functional.cross_entropy(functional_call(model, p, (x,)), y)

        def step(p, x, y):
            grads, loss = grad_and_value(loss_of)(p, x, y)
            with torch.no_grad():
                for key in p:
                    p[key].sub_(grads[key], alpha=0.1)
            return loss

        step = torch.compile(step, backend="neuron") if compiled else step
        losses = [step(params, x.to(device), y.to(device)).item() for _ in range(3)]
        return losses, {k: v.cpu() for k, v in params.items()}

    cpu_losses, cpu_params = run("cpu", False)
    eager_losses, eager_params = run(dev, False)
    accelkit.reset_stats()
    losses, params = run(dev, True)
    assert losses == eager_losses
    assert losses == pytest.approx(cpu_losses, rel=1e-5, abs=1e-6)
    for key, want in cpu_params.items():
        assert torch.equal(params[key], eager_params[key]), key
        torch.testing.assert_close(params[key], want, rtol=1e-4, atol=1e-5)
    stats = accelkit.stats()
    assert stats["compile"]["eager_nodes"] == {} and stats["compile"]["graph_breaks"] == 0, stats["compile"]
    assert len(stats["neuron"]["estimate"]["per_program"]) == 1, stats["neuron"]["estimate"]["per_program"]


@pytest.mark.parametrize("factory", ["full_like", "zeros_like", "ones_like", "new_full", "new_zeros", "new_ones"])
def test_factories_shaped_like_a_tensor_lower_into_the_program(dev, factory):
    make = {"full_like": lambda t: torch.full_like(t, 2.5), "zeros_like": torch.zeros_like,
            "ones_like": torch.ones_like, "new_full": lambda t: t.new_full((3, 2), -1.0),
            "new_zeros": lambda t: t.new_zeros((2, 5)), "new_ones": lambda t: t.new_ones(4)}[factory]

    def fn(t):
        made = make(t)
        return made * 2 + t.sum()

    x = torch.randn(4, 6)[:, ::2]  # strided: a *_like result follows the input's layout
    compiled = torch.compile(fn, backend="neuron")
    for _ in range(2):  # recorded, then replayed
        got = compiled(x.to(dev))
        want = fn(x)
        assert got.shape == want.shape and got.dtype == want.dtype and got.stride() == want.stride()
        torch.testing.assert_close(got.cpu(), want)
    assert accelkit.stats()["compile"]["eager_nodes"] == {}


def test_split_views_and_a_copy_into_a_graph_tensor_lower_into_the_program(dev):
    """A multi-output view (``split``, ``chunk``: a view per piece) and the functional ``copy``
    that ``empty(...).copy_(src)`` becomes (with a cast and a broadcast) are in the program: a
    transformer's fused qkv projection and vLLM's attention output take these forms."""

    def fn(x, y):
        q, k, v = x.split([2, 1, 3], dim=-1)
        a, b = x.chunk(2, dim=-1)
        out = torch.empty(4, 6, device=x.device)
        out.copy_(torch.cat([a, a], dim=-1) * 2)
        half = torch.empty(4, 6, device=x.device, dtype=torch.bfloat16)
        half.copy_(y)
        return q + k, v * b, out + 1, half

    x, y = torch.randn(4, 6), torch.randn(6)
    compiled = torch.compile(fn, backend="neuron", fullgraph=True)
    for _ in range(2):  # recorded, then replayed
        got = compiled(x.to(dev), y.to(dev))
        for have, want in zip(got, fn(x, y), strict=True):
            assert have.dtype == want.dtype
            torch.testing.assert_close(have.cpu(), want)
    assert accelkit.stats()["compile"]["eager_nodes"] == {}
