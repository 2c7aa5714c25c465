"""torch.compile(backend="tpu"): whole graphs as XLA programs, compared with CPU PyTorch.

Each model trains a few SGD steps with the whole step function compiled (forward, backward and
the optimizer's graphs) and is compared with the same steps on the CPU: losses, parameters and
buffers. The statistics must show the work was compiled (programs built, nothing split out).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch._dynamo
from torch import nn

import accelkit
from accelkit_backends.tpu import execution_mode
from accelkit_backends.tpu.graph_lowering import TpuGraphLowering

from conftest import run_python


def sgd_step(model, optimizer, x, y, loss_fn):
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def train_both(dev, model, x, y, loss_fn, steps=3, lr=0.05, momentum=0.9):
    """Train ``model`` on CPU eagerly and a copy on tpu under compile; return both, losses."""
    cpu_model, tpu_model = model, copy.deepcopy(model).to(dev)
    cpu_opt = torch.optim.SGD(cpu_model.parameters(), lr=lr, momentum=momentum)
    tpu_opt = torch.optim.SGD(tpu_model.parameters(), lr=lr, momentum=momentum)
    compiled = torch.compile(sgd_step, backend="tpu")
    losses = []
    for _ in range(steps):
        cpu_loss = sgd_step(cpu_model, cpu_opt, x, y, loss_fn)
        tpu_loss = compiled(tpu_model, tpu_opt, x.to(dev), y.to(dev), loss_fn)
        losses.append((cpu_loss.item(), tpu_loss.item()))
    return cpu_model, tpu_model, losses


def assert_same_state(cpu_model, tpu_model, atol):
    for (name, a), (_, b) in zip(cpu_model.state_dict().items(), tpu_model.state_dict().items()):
        assert b.device.type == "tpu", name
        torch.testing.assert_close(b.cpu(), a, atol=atol, rtol=1e-4, msg=lambda m: f"{name}: {m}")


def assert_compiled(eager_nodes_allowed=()):
    stats = accelkit.stats()["compile"]
    assert stats["programs_compiled"] > 0 and stats["program_calls"] > 0, stats
    assert set(stats["eager_nodes"]) <= set(eager_nodes_allowed), stats["eager_nodes"]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_mlp_trains_as_on_cpu(dev):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 10))
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
    cpu_model, tpu_model, losses = train_both(dev, model, x, y, nn.functional.cross_entropy)
    for cpu_loss, tpu_loss in losses:
        assert tpu_loss == pytest.approx(cpu_loss, abs=1e-5)
    assert losses[-1][1] < losses[0][1]
    assert_same_state(cpu_model, tpu_model, atol=1e-5)
    stats = accelkit.stats()["compile"]
    assert_compiled()
    assert stats["aot_graphs"]["forward"] == 1 and stats["aot_graphs"]["backward"] == 1
    assert stats["program_cache_hits"] > 0  # later steps reuse the programs


def test_cnn_with_batchnorm_updates_running_stats(dev):
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(8 * 4 * 4, 10),
    )
    x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))
    cpu_model, tpu_model, losses = train_both(dev, model, x, y, nn.functional.cross_entropy)
    for cpu_loss, tpu_loss in losses:
        assert tpu_loss == pytest.approx(cpu_loss, abs=1e-4)
    assert_same_state(cpu_model, tpu_model, atol=1e-4)  # running_mean/var and num_batches_tracked too
    assert tpu_model[1].num_batches_tracked.item() == 3
    assert_compiled()


def test_transformer_encoder_trains_as_on_cpu(dev):
    torch.manual_seed(0)
    model = nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True), 2,
                                  enable_nested_tensor=False)
    x, y = torch.randn(4, 10, 32), torch.randn(4, 10, 32)
    cpu_model, tpu_model, losses = train_both(dev, model, x, y, nn.functional.mse_loss, lr=0.01)
    for cpu_loss, tpu_loss in losses:
        assert tpu_loss == pytest.approx(cpu_loss, rel=1e-4)
    assert_same_state(cpu_model, tpu_model, atol=1e-4)
    assert_compiled()


def test_an_mlp_a_cnn_and_an_encoder_layer_compiled_in_one_process_match_eager(dev, monkeypatch):
    # One Dynamo cache for the three models (no reset between them): the recompiles make Dynamo
    # turn the later graphs dynamic by itself; every program takes its shapes from the call.
    symbolic = []  # per graph lowered: whether it has symbolic sizes (else the test tests nothing)
    lower = TpuGraphLowering.lower

    def spy(self, graph, random_nodes):
        vals = [node.meta.get("val") for node in graph.graph.nodes if node.op == "placeholder"]
        sizes = [size for val in vals for size in (val.shape if isinstance(val, torch.Tensor) else (val,))]
        symbolic.append(any(isinstance(size, torch.SymInt) for size in sizes))
        return lower(self, graph, random_nodes)

    monkeypatch.setattr(TpuGraphLowering, "lower", spy)
    models = (
        (lambda: nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)), (8, 16)),
        (lambda: nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                               nn.Flatten(), nn.Linear(8 * 4 * 4, 5)), (4, 3, 8, 8)),
        (lambda: nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True), (2, 5, 16)),
    )
    for make_model, shape in models:
        torch.manual_seed(0)
        eager = make_model().to(dev)
        compiled_model = copy.deepcopy(eager)
        compiled = torch.compile(compiled_model, backend="tpu")
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).to(dev)
        want, got = eager(x), compiled(x)
        want.square().mean().backward()
        got.square().mean().backward()
        torch.testing.assert_close(got.cpu(), want.cpu(), rtol=1e-5, atol=1e-6)
        for (name, p_eager), p_compiled in zip(eager.named_parameters(), compiled_model.parameters()):
            torch.testing.assert_close(p_compiled.grad.cpu(), p_eager.grad.cpu(), rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"{name}: {m}")
    stats = accelkit.stats()["compile"]
    assert stats["aot_graphs"] == {"forward": 3, "backward": 3} and stats["eager_nodes"] == {}, stats
    assert sum(symbolic) >= 2, symbolic  # the CNN's and the layer's graphs at least


def test_gru_trains_as_on_cpu(dev, monkeypatch):
    monkeypatch.setattr(torch._dynamo.config, "allow_rnn", True)  # Dynamo's own default skips RNNs
    torch.manual_seed(0)

    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.gru = nn.GRU(16, 32, batch_first=True)
            self.head = nn.Linear(32, 5)

        def forward(self, x):
            return self.head(self.gru(x)[0]).flatten(0, 1)

    x, y = torch.randn(4, 7, 16), torch.randint(0, 5, (28,))
    cpu_model, tpu_model, losses = train_both(dev, Tagger(), x, y, nn.functional.cross_entropy)
    for cpu_loss, tpu_loss in losses:
        assert tpu_loss == pytest.approx(cpu_loss, abs=1e-5)
    assert_same_state(cpu_model, tpu_model, atol=1e-5)
    assert_compiled()


def test_seeded_dropout_is_reproducible_and_drops_half(dev):
    dropout = nn.Dropout(0.5)
    compiled = torch.compile(lambda x: dropout(x), backend="tpu")
    x = torch.ones(4000, device=dev)
    torch.manual_seed(7)
    first = compiled(x).cpu()
    torch.manual_seed(7)
    again = compiled(x).cpu()
    later = compiled(x).cpu()
    assert torch.equal(first, again)
    assert not torch.equal(first, later)
    assert set(first.unique().tolist()) == {0.0, 2.0}
    assert abs((first != 0).float().mean().item() - 0.5) < 0.05  # eager's distribution
    eager = dropout(x).cpu()
    assert abs((eager != 0).float().mean().item() - (first != 0).float().mean().item()) < 0.06


def test_input_mutations_and_aliasing(dev):
    def update(x, y):
        x.add_(1)
        y[0] = 5
        return x.view(-1)[:2], y.t()

    compiled = torch.compile(update, backend="tpu")
    x, y = torch.zeros(2, 2, device=dev), torch.zeros(3, 2, device=dev)
    version = x._version
    first, transposed = compiled(x, y)
    assert x.cpu().tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert y.cpu().tolist() == [[5.0, 5.0], [0.0, 0.0], [0.0, 0.0]]
    assert x._version > version  # as copy_ would: autograd sees the mutation
    assert first.data_ptr() == x.data_ptr() and transposed.data_ptr() == y.data_ptr()
    assert transposed.shape == (2, 3) and transposed.stride() == (1, 2)
    x.mul_(2)
    assert first.cpu().tolist() == [2.0, 2.0]  # still a view of x


def test_graph_breaks_are_counted(dev):
    def broken(x):
        x = x * 2
        torch._dynamo.graph_break()
        return x + 1

    before = accelkit.stats()["compile"]["graph_breaks"]
    out = torch.compile(broken, backend="tpu")(torch.ones(3, device=dev))
    assert out.cpu().tolist() == [3.0, 3.0, 3.0]
    stats = accelkit.stats()["compile"]
    assert stats["graph_breaks"] == before + 1
    assert any("graph_break" in reason for reason in stats["graph_break_reasons"])
    assert stats["graphs_captured"] == 2


@torch.library.custom_op("accelkit_test::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@twice.register_fake
def _(x):
    return torch.empty_like(x)


def test_unlowerable_node_splits_the_graph_and_runs_eagerly(dev):
    compiled = torch.compile(lambda x: twice(x.sin()).cos(), backend="tpu")
    x = torch.randn(5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = compiled(x.to(dev))
    torch.testing.assert_close(out.cpu(), (x.sin() * 2).cos())
    stats = accelkit.stats()["compile"]
    assert stats["eager_nodes"] == {"accelkit_test.twice.default": 1}
    assert stats["program_segments"] == 2  # sin before it, cos after it


def test_deny_refuses_a_graph_with_unlowerable_nodes(dev):
    compiled = torch.compile(lambda x: twice(x) + 1, backend="tpu")
    with accelkit.fallback_policy("deny"), pytest.raises(Exception, match=r"accelkit_test.twice.default.*deny"):
        compiled(torch.ones(3, device=dev))


def test_dynamic_shapes_one_graph_one_program_per_shape(dev):
    compiled = torch.compile(lambda x: (x * 2).sum(0) + x.shape[0], backend="tpu", dynamic=True)
    accelkit.reset_stats()
    for rows in (3, 5, 7, 9, 11):
        x = torch.randn(rows, 4)
        torch.testing.assert_close(compiled(x.to(dev)).cpu(), (x * 2).sum(0) + rows)
    stats = accelkit.stats()["compile"]
    assert stats["graphs_captured"] == 1
    assert stats["programs_compiled"] == 5


def test_buckets_compile_once_per_bucket(dev):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).eval()
    on_tpu = copy.deepcopy(layer).to(dev)

    def encode(x, attention_mask):
        return on_tpu(x, src_key_padding_mask=attention_mask == 0)

    model = accelkit.bucketed(torch.compile(encode, backend="tpu"), (8, 16, 32))
    accelkit.reset_stats()
    with torch.no_grad():
        for length in (3, 5, 8, 11, 16, 20, 27):
            x = torch.randn(2, length, 32)
            mask = torch.ones(2, length, dtype=torch.long)
            mask[1, length // 2:] = 0
            out = model(x.to(dev), attention_mask=mask.to(dev)).cpu()
            expected = layer(x, src_key_padding_mask=mask == 0)
            assert out.shape == expected.shape
            real = mask.bool()
            torch.testing.assert_close(out[real], expected[real], atol=1e-5, rtol=1e-5)
    assert accelkit.stats()["compile"]["programs_compiled"] <= 3
    with pytest.raises(ValueError, match="exceeds the largest bucket 32"):
        model(torch.randn(2, 40, 32, device=dev), attention_mask=torch.ones(2, 40, device=dev))


def test_device_side_check_inside_a_compiled_graph(dev):
    compiled = torch.compile(lambda x, i: x[i] * 2, backend="tpu")
    x = torch.arange(6.0, device=dev)
    assert compiled(x, torch.tensor([1, 5], device=dev)).cpu().tolist() == [2.0, 10.0]
    assert accelkit.stats()["compile"]["eager_nodes"] == {}  # the gather is inside the program
    with execution_mode("debug"), pytest.raises(IndexError, match="out of bounds"):
        compiled(x, torch.tensor([1, 6], device=dev))


def test_default_backend_runs_through_the_tpu_compiler(dev):
    model = nn.Sequential(nn.Linear(4, 3), nn.GELU()).to(dev)
    x = torch.randn(2, 4, device=dev)
    out = torch.compile(model)(x)  # Inductor would fail: it has no code generator for this device
    torch.testing.assert_close(out.cpu(), model(x).cpu())
    assert accelkit.stats()["compile"]["graphs_captured"] == 1


def test_runtime_is_opaque_to_dynamo_under_aot_eager(dev):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 2))
    x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))
    tpu_model = copy.deepcopy(model).to(dev)
    opt = torch.optim.SGD(tpu_model.parameters(), lr=0.1, momentum=0.9)
    cpu_opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    compiled = torch.compile(sgd_step, backend="aot_eager")
    for _ in range(2):
        loss = compiled(tpu_model, opt, x.to(dev), y.to(dev), nn.functional.cross_entropy)
        cpu_loss = sgd_step(model, cpu_opt, x, y, nn.functional.cross_entropy)
        assert loss.item() == pytest.approx(cpu_loss.item(), abs=1e-5)
    reasons = " ".join(accelkit.stats()["compile"]["graph_break_reasons"])
    assert "logging" not in reasons and "jax" not in reasons  # Dynamo never traced our code


def test_persistent_cache_is_hit_by_a_second_process(tmp_path):
    code = """
        import torch, accelkit
        dev = accelkit.select_device("tpu")
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).to(dev)
        torch.compile(model, backend="tpu")(torch.randn(2, 8, device=dev)).sum().backward()
        cache = accelkit.stats()["compile"]["persistent_cache"]
        print(cache["hits"], cache["misses"])
    """
    env = {"ACCELKIT_COMPILE_CACHE": str(tmp_path)}
    cold = run_python(code, env)
    assert cold.returncode == 0, cold.stderr
    warm = run_python(code, env)
    assert warm.returncode == 0, warm.stderr
    cold_hits, cold_misses = map(int, cold.stdout.split())
    warm_hits, warm_misses = map(int, warm.stdout.split())
    assert cold_hits == 0 and cold_misses > 0
    assert warm_hits == cold_misses and warm_misses == 0


def test_hugging_face_static_cache_generate_compiles_decode_once(dev):
    transformers = pytest.importorskip("transformers", reason="transformers is in the test extra")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    prompt = torch.randint(0, 128, (1, 6))
    with torch.no_grad():
        expected = model.generate(prompt, max_new_tokens=8, do_sample=False, cache_implementation="static")
    model.to(dev)
    model.forward = torch.compile(model.forward, backend="tpu")
    accelkit.reset_stats()
    with torch.no_grad():
        tokens = model.generate(prompt.to(dev), max_new_tokens=8, do_sample=False, cache_implementation="static")
    assert tokens.cpu().tolist() == expected.tolist()
    stats = accelkit.stats()["compile"]
    assert stats["graphs_captured"] == 2  # the prefill and the decode step
    assert stats["programs_compiled"] == 2  # the decode step's program serves all 7 decode steps
    assert stats["program_calls"] == 8 and stats["eager_nodes"] == {}


def test_ops_whose_pytorch_decomposition_differs_from_cpu_trace_as_cpu_computes(dev):
    # torch 2.13 registers multilabel_margin_loss's decomposition as its Python autograd kernel
    # too, which tracing runs first: even PyTorch's own compilers counted the label slots after
    # a sample's first -1 as labels. Graphs compiled here get accelkit's decomposition.
    x = torch.linspace(-2, 2, 8).reshape(2, 4)
    target = torch.tensor([[3, 0, -1, 1], [1, -1, 0, 0]])
    cpu_x = x.clone().requires_grad_()
    want = torch.nn.functional.multilabel_margin_loss(cpu_x, target, reduction="none")
    want.sum().backward()
    dev_x = x.to(dev).requires_grad_()
    loss = torch.compile(lambda a, b: torch.nn.functional.multilabel_margin_loss(a, b, reduction="none"),
                         backend="tpu")(dev_x, target.to(dev))
    loss.sum().backward()
    torch.testing.assert_close(loss.detach().cpu(), want.detach())
    torch.testing.assert_close(dev_x.grad.cpu(), cpu_x.grad)
    # Outside accelkit's compiler, PyTorch's kernel is back.
    op = torch.ops.aten.multilabel_margin_loss_forward.default
    assert op.py_kernels[torch._C.DispatchKey.Autograd].__module__ == "torch._decomp.decompositions"


def test_complex_rotary_embeddings_compile_into_the_program(dev):
    # TorchTitan's llama3 RoPE: view_as_complex, a complex multiply, view_as_real; its
    # backward multiplies by the conjugate (a _conj view node in the graph).
    torch._dynamo.reset()
    angles = torch.outer(torch.arange(8.0), 1.0 / 500000 ** (torch.arange(0, 16, 2)[:8].float() / 16))
    freqs = torch.polar(torch.ones_like(angles), angles)

    def rope(x, freqs):
        pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(pairs * freqs.view(1, 8, 1, 8)).flatten(3).type_as(x)

    x = torch.randn(2, 8, 4, 16, generator=torch.Generator().manual_seed(0))
    want_x = x.clone().requires_grad_()
    (rope(want_x, freqs) * torch.arange(16.0)).sum().backward()
    dev_x = x.to(dev).requires_grad_()
    accelkit.reset_stats()
    got = torch.compile(rope, backend="tpu")(dev_x, freqs.to(dev))
    (got * torch.arange(16.0, device=dev)).sum().backward()
    torch.testing.assert_close(got.detach().cpu(), rope(x, freqs), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(dev_x.grad.cpu(), want_x.grad, rtol=1e-6, atol=1e-6)
    assert accelkit.stats()["compile"]["eager_nodes"] == {}


@pytest.mark.parametrize(("source", "target"), [
    (torch.int32, torch.float32), (torch.float32, torch.int32), (torch.float32, torch.uint8),
    (torch.uint8, torch.float32), (torch.bfloat16, torch.int16), (torch.int64, torch.int32),
    (torch.float32, torch.bfloat16), (torch.uint8, torch.bool), (torch.bool, torch.int8),
])
def test_a_dtype_view_reinterprets_the_bytes_in_the_program(dev, source, target):
    """``x.view(dtype)`` in a compiled graph is the same bytes as ``target`` (a narrower dtype
    splits the last dimension's elements, a wider one joins them), as eagerly; it used to be
    an index-tensor view, which picked elements (or raised, for a float target)."""
    torch._dynamo.reset()
    accelkit.reset_stats()
    x = (torch.randn(3, 8) * 100).to(source) if source != torch.uint8 else torch.randint(0, 2, (3, 8), dtype=source)

    def fn(t):
        return t.view(target).clone()

    got = torch.compile(fn, backend="tpu", fullgraph=True, dynamic=False)(x.to(dev)).cpu()
    want = fn(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)) if target != torch.bool else torch.equal(got, want)
    assert accelkit.stats()["compile"]["eager_nodes"] == {}
