"""``torch.ref``, the device module: identity, device selection, properties, AMP dtypes and RNG,
plus what ``torch.accelerator`` reports for the active backend."""

from __future__ import annotations

import os
import warnings

import pytest
import torch
import torch.nn.functional as F

from accelkit.sdk import CUDA_LIKE_AUTOCAST
from accelkit_backends.ref.device import parse_bytes


# ---------------------------------------------------------------------------------------------
# identity and availability
# ---------------------------------------------------------------------------------------------


def test_device_module_is_registered_under_the_backend_name(dev):
    assert torch.get_device_module("ref") is torch.ref
    assert torch.get_device_module(dev) is torch.ref
    assert torch.ref.__name__ == "torch.ref"


def test_ref_is_available_with_one_device():
    assert torch.ref.is_available()
    assert torch.ref.is_built()
    assert torch.ref.is_initialized()
    assert torch.ref.device_count() == 1
    assert torch.ref.current_device() == 0


@pytest.mark.parametrize("which", [0, "ref", "ref:0", "device"])
def test_device_context_manager_selects_device_zero(dev, which):
    with torch.ref.device(dev if which == "device" else which):
        x = torch.ones(2, device="ref")
        assert torch.ref.current_device() == 0
    assert x.device == dev
    assert x.cpu().tolist() == [1.0, 1.0]


def test_generated_tensor_and_module_methods_move_to_the_current_device(dev):
    t = torch.arange(3.0).ref()
    assert t.device == dev
    assert t.is_ref
    m = torch.nn.Linear(2, 2).ref()
    assert m.weight.device == dev


def test_synchronize_returns_after_work_is_done(dev):
    x = torch.randn(64, 64, device=dev)
    y = x @ x
    assert torch.ref.synchronize() is None
    assert torch.ref.synchronize(dev) is None
    assert torch.ref.synchronize(0) is None
    torch.testing.assert_close(y.cpu(), x.cpu() @ x.cpu())


# ---------------------------------------------------------------------------------------------
# properties
# ---------------------------------------------------------------------------------------------


def test_device_properties_describe_the_simulated_ref_device(dev):
    props = torch.ref.get_device_properties()
    assert props == torch.ref.get_device_properties(dev) == torch.ref.get_device_properties(0)
    assert props.simulated is True
    assert props.name == "accelkit host"  # ref's device model names no product: vendor and target
    assert props.total_memory == parse_bytes(os.environ["ACCELKIT_REF_MEMORY"])
    assert props.total_memory == torch.ref.mem_get_info()[1]


def test_device_name_is_the_properties_name_saying_simulated_ref():
    name = torch.ref.get_device_name()
    assert name == f"{torch.ref.get_device_properties().name} (simulated ref)"
    assert torch.ref.get_device_name(0) == name


# ---------------------------------------------------------------------------------------------
# AMP dtypes
# ---------------------------------------------------------------------------------------------


def test_amp_supported_dtypes_are_the_autocast_policy_dtypes():
    supported = torch.ref.get_amp_supported_dtype()
    assert supported == list(CUDA_LIKE_AUTOCAST.dtypes)
    assert torch.bfloat16 in supported and torch.float16 in supported
    assert torch.ref.is_bf16_supported()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_accepts_each_supported_dtype_silently(dev, dtype):
    a = torch.randn(3, 4, device=dev)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.autocast("ref", dtype=dtype):
            assert torch.is_autocast_enabled("ref")
            assert torch.get_autocast_dtype("ref") == dtype
            assert (a @ a.t()).dtype == dtype


def test_autocast_with_an_unsupported_dtype_warns_and_stays_off(dev):
    a = torch.randn(3, 4, device=dev)
    with pytest.warns(UserWarning, match="not supported"):
        with torch.autocast("ref", dtype=torch.float64):
            assert (a @ a.t()).dtype == torch.float32


# ---------------------------------------------------------------------------------------------
# RNG
# ---------------------------------------------------------------------------------------------


def test_torch_manual_seed_makes_device_randn_reproducible(dev):
    torch.manual_seed(1234)
    first = torch.randn(100, device=dev).cpu()
    torch.manual_seed(1234)
    second = torch.randn(100, device=dev).cpu()
    torch.manual_seed(4321)
    other = torch.randn(100, device=dev).cpu()
    assert torch.equal(first, second)
    assert not torch.equal(first, other)


def test_device_manual_seed_makes_device_randn_reproducible(dev):
    torch.ref.manual_seed(77)
    first = torch.randn(3, 50, device=dev).cpu()
    assert torch.ref.initial_seed() == 77
    torch.ref.manual_seed(77)
    second = torch.randn(3, 50, device=dev).cpu()
    assert torch.equal(first, second)
    assert not torch.equal(first[0], first[1])  # successive draws move the stream on


def test_device_stream_is_separate_from_the_cpu_stream(dev):
    torch.manual_seed(5)
    undisturbed = torch.randn(20, device=dev).cpu()
    torch.manual_seed(5)
    torch.randn(1000)  # CPU draws do not advance the device generator
    disturbed = torch.randn(20, device=dev).cpu()
    assert torch.equal(undisturbed, disturbed)

    torch.manual_seed(5)
    cpu_first = torch.randn(20)
    torch.manual_seed(5)
    torch.ref.manual_seed(99)  # reseeding the device leaves the CPU stream alone
    torch.randn(20, device=dev)  # and so do device draws
    assert torch.equal(torch.randn(20), cpu_first)


@pytest.mark.parametrize(
    "draw",
    [
        lambda d: torch.rand(30, device=d),
        lambda d: torch.randint(0, 1000, (30,), device=d),
        lambda d: torch.randperm(30, device=d),
        lambda d: torch.empty(30, device=d).normal_(2.0, 3.0),
        lambda d: torch.empty(30, device=d).uniform_(-1, 1),
        lambda d: torch.bernoulli(torch.full((30,), 0.5, device=d)),
        lambda d: torch.multinomial(torch.ones(30, device=d), 10),
        lambda d: F.dropout(torch.ones(30, device=d), p=0.5),
        lambda d: F.alpha_dropout(torch.ones(30, device=d), p=0.5, training=True),
        lambda d: F.scaled_dot_product_attention(*[torch.ones(1, 2, 6, 4, device=d)] * 3, dropout_p=0.5),
    ],
    ids=["rand", "randint", "randperm", "normal_", "uniform_", "bernoulli", "multinomial", "dropout",
         "alpha_dropout", "sdpa-dropout"],
)
def test_every_random_op_follows_the_device_seed(dev, draw):
    torch.ref.manual_seed(2024)
    first = draw(dev).cpu()
    torch.ref.manual_seed(2024)
    second = draw(dev).cpu()
    torch.ref.manual_seed(2025)
    other = draw(dev).cpu()
    assert torch.equal(first, second)
    assert not torch.equal(first, other)


def test_get_and_set_rng_state_restore_the_stream(dev):
    torch.ref.manual_seed(8)
    torch.randn(10, device=dev)
    state = torch.ref.get_rng_state()
    assert isinstance(state, torch.Tensor) and state.dtype == torch.uint8
    expected = torch.randn(10, device=dev).cpu()
    torch.randn(10, device=dev)  # move on
    torch.ref.set_rng_state(state)
    assert torch.equal(torch.randn(10, device=dev).cpu(), expected)

    states = torch.ref.get_rng_state_all()
    assert len(states) == torch.ref.device_count()
    again = torch.randn(10, device=dev).cpu()
    torch.ref.set_rng_state_all(states)
    assert torch.equal(torch.randn(10, device=dev).cpu(), again)


def test_get_rng_state_is_a_snapshot_not_a_live_view(dev):
    torch.ref.manual_seed(8)
    state = torch.ref.get_rng_state()
    copy = state.clone()
    torch.randn(100, device=dev)
    assert torch.equal(state, copy)


def test_fork_rng_isolates_the_device_stream(dev):
    torch.ref.manual_seed(31)
    state = torch.ref.get_rng_state()
    expected = torch.randn(10, device=dev).cpu()

    torch.ref.set_rng_state(state)
    with torch.random.fork_rng(device_type="ref"):
        inside = torch.randn(10, device=dev).cpu()
        torch.randn(500, device=dev)
    after = torch.randn(10, device=dev).cpu()
    assert torch.equal(inside, expected)
    assert torch.equal(after, expected)


def test_dropout_is_reproducible_and_behaves_like_cpu_dropout(dev):
    x = torch.ones(2000, device=dev)
    torch.manual_seed(3)
    first = F.dropout(x, p=0.3, training=True).cpu()
    torch.manual_seed(3)
    second = F.dropout(x, p=0.3, training=True).cpu()
    torch.manual_seed(4)
    other = F.dropout(x, p=0.3, training=True).cpu()
    assert torch.equal(first, second)
    assert not torch.equal(first, other)

    cpu = F.dropout(torch.ones(2000), p=0.3, training=True)
    assert set(first.unique().tolist()) == set(cpu.unique().tolist())  # 0 and 1 / 0.7
    assert abs((first == 0).float().mean().item() - 0.3) < 0.05
    assert torch.equal(F.dropout(x, p=0.3, training=False).cpu(), x.cpu())


def test_dropout_draws_from_the_device_stream_not_the_cpu_stream(dev):
    x = torch.ones(500, device=dev)
    torch.ref.manual_seed(21)
    first = F.dropout(x, p=0.5).cpu()
    torch.ref.manual_seed(21)
    torch.randn(100)  # CPU draws in between do not change the device's dropout mask
    assert torch.equal(F.dropout(x, p=0.5).cpu(), first)

    torch.manual_seed(0)
    expected_cpu = torch.randn(5)
    torch.manual_seed(0)
    F.dropout(x, p=0.5)  # and a device dropout does not consume CPU random numbers
    assert torch.equal(torch.randn(5), expected_cpu)


def test_fork_rng_isolates_dropout(dev):
    x = torch.ones(500, device=dev)
    torch.ref.manual_seed(9)
    with torch.random.fork_rng(device_type="ref"):
        F.dropout(x, p=0.5)
    after_fork = F.dropout(x, p=0.5).cpu()
    torch.ref.manual_seed(9)
    assert torch.equal(F.dropout(x, p=0.5).cpu(), after_fork)


def test_dropout_module_is_reproducible_in_training(dev):
    layer = torch.nn.Dropout(0.5).to(dev).train()
    x = torch.randn(8, 16, device=dev)
    torch.ref.manual_seed(11)
    first = layer(x).cpu()
    torch.ref.manual_seed(11)
    second = layer(x).cpu()
    assert torch.equal(first, second)
    kept = first != 0
    torch.testing.assert_close(first[kept], (x.cpu() * 2)[kept])


# ---------------------------------------------------------------------------------------------
# torch.accelerator
# ---------------------------------------------------------------------------------------------


def test_torch_accelerator_reports_ref(dev):
    acc = torch.accelerator.current_accelerator()
    assert acc is not None and acc.type == "ref"
    assert torch.accelerator.current_accelerator(check_available=True).type == "ref"
    assert torch.accelerator.is_available()
    assert torch.accelerator.device_count() == 1
    assert torch.accelerator.current_device_index() == 0
    assert torch.ones(1, device=acc).device == dev


# ---------------------------------------------------------------------------------------------
# only index 0 exists
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.ones(1, device="ref:1"),
        lambda: torch.empty(2, 3, device="ref:1"),
        lambda: torch.tensor([1.0, 2.0], device="ref:1"),
        lambda: torch.arange(3.0).to("ref:1"),
        lambda: torch.randn(2, device=torch.device("ref", 1)),
    ],
    ids=["ones", "empty", "tensor", "to", "randn"],
)
def test_tensors_on_index_one_are_refused_with_a_clear_message(dev, no_gc, make):
    base = torch.ref.memory_allocated()
    with pytest.raises(RuntimeError, match=r"ref:1 does not exist: this process has 1 ref device") as info:
        make()
    message = str(info.value)
    assert "ACCELKIT_REF_DEVICES" in message
    assert "one process per device" in message
    del info
    assert torch.ref.memory_allocated() == base


@pytest.mark.parametrize(
    "call",
    [
        lambda: torch.ref.set_device(1),
        lambda: torch.ref.set_device("ref:1"),
        lambda: torch.ref.get_device_properties(1),
        lambda: torch.ref.synchronize(1),
        lambda: torch.ref.memory_allocated("ref:1"),
    ],
    ids=["set_device", "set_device-str", "properties", "synchronize", "memory_allocated"],
)
def test_device_module_refuses_index_one_with_a_clear_message(call):
    with pytest.raises(ValueError, match=r"ref:1 does not exist: this process has 1 ref device") as info:
        call()
    assert "ACCELKIT_REF_DEVICES" in str(info.value)


def test_device_context_manager_refuses_index_one():
    with pytest.raises(ValueError, match=r"ref:1 does not exist"):
        with torch.ref.device(1):
            pass


def test_device_module_refuses_another_device_type():
    with pytest.raises(ValueError, match="expected a ref device"):
        torch.ref.set_device("cpu")


def test_index_zero_is_accepted_everywhere(dev):
    torch.ref.set_device(0)
    torch.ref.set_device("ref:0")
    torch.ref.set_device(dev)
    assert torch.ones(1, device="ref:0").device == dev
    assert torch.ref.current_device() == 0


# ---------------------------------------------------------------------------------------------
# streams and events: one in-order queue
# ---------------------------------------------------------------------------------------------


def test_streams_are_the_devices_one_in_order_queue(dev):
    side = torch.ref.Stream(priority=-1)
    assert isinstance(side, torch.Stream) and side.device == torch.device("ref", 0)
    assert torch.ref.current_stream() == torch.ref.default_stream() == side  # one queue
    with torch.ref.stream(side):
        x = torch.arange(4.0, device=dev) * 2
    event = side.record_event()
    torch.ref.current_stream().wait_event(event)
    torch.ref.current_stream().wait_stream(side)
    x.record_stream(side)
    assert event.query()
    assert x.cpu().tolist() == [0.0, 2.0, 4.0, 6.0]
    with pytest.raises(ValueError, match="needs a ref stream"):
        torch.ref.set_stream(torch.Stream(device="cpu"))


def test_a_device_storage_resizes_as_a_cpu_storage_does(dev):
    x = torch.arange(6.0, device=dev)
    storage = x.untyped_storage()
    storage.resize_(0)
    assert storage.nbytes() == 0
    storage.resize_(24)
    restored = torch.empty(0, device=dev).set_(storage, 0, (6,), (1,))
    restored.copy_(torch.arange(6.0))
    storage.resize_(16)
    assert storage.nbytes() == 16
    assert torch.empty(0, device=dev).set_(storage, 0, (4,), (1,)).cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(RuntimeError, match=">= 0"):
        storage.resize_(-1)


def test_a_non_blocking_copy_to_the_host_is_an_ordinary_host_tensor(dev):
    x = torch.arange(5.0, device=dev)
    host = x.to("cpu", non_blocking=True)
    assert host.device.type == "cpu" and not host.is_pinned()
    assert host.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
