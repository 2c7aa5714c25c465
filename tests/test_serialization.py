"""``torch.save`` / ``torch.load`` and ``copy.deepcopy`` of device tensors and modules.

Values are checked against the CPU tensors they came from; aliasing is checked by writing
through one loaded tensor and reading through another.
"""

from __future__ import annotations

import copy
import io
import struct
import zipfile

import pytest
import torch
from torch import nn


def roundtrip(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kwargs)


MAP_TO_DEVICE = [None, "device", "ref", "ref:0"]


def _map(location, dev):
    return dev if location == "device" else location


@pytest.mark.parametrize("location", MAP_TO_DEVICE)
def test_device_tensor_loads_back_on_the_device(dev, location):
    cpu = torch.randn(3, 5)
    loaded = roundtrip(cpu.to(dev), map_location=_map(location, dev))
    assert loaded.device == dev
    assert loaded.dtype == cpu.dtype
    assert loaded.shape == cpu.shape
    assert torch.equal(loaded.cpu(), cpu)


def test_device_tensor_loads_on_cpu_with_map_location_cpu(dev):
    cpu = torch.randn(4, 2)
    loaded = roundtrip(cpu.to(dev), map_location="cpu")
    assert loaded.device.type == "cpu"
    assert torch.equal(loaded, cpu)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.int8, torch.int64, torch.bool,
                                   torch.complex64])
def test_every_dtype_round_trips_bit_exactly(dev, dtype):
    cpu = (torch.randn(17) * 50).to(dtype) if dtype != torch.bool else torch.randn(17) > 0
    loaded = roundtrip(cpu.to(dev))
    assert loaded.dtype == dtype
    assert torch.equal(loaded.cpu(), cpu)


@pytest.mark.parametrize("location", [*MAP_TO_DEVICE, "cpu"])
def test_views_saved_together_still_alias_after_load(dev, location):
    x = torch.arange(12.0, device=dev).reshape(3, 4)
    saved = {"x": x, "t": x.t(), "row": x[1], "tail": x.view(-1)[5:]}
    loaded = roundtrip(saved, map_location=_map(location, dev))
    lx, lt, lrow, ltail = loaded["x"], loaded["t"], loaded["row"], loaded["tail"]

    assert lt.stride() == x.t().stride()
    assert lrow.storage_offset() == 4
    assert ltail.storage_offset() == 5
    assert torch.equal(lt.cpu(), lx.cpu().t())

    lt[0, 1] = -1.0  # element (1, 0) of x
    assert lx[1, 0].item() == -1.0
    assert lrow[0].item() == -1.0
    lrow.mul_(10)
    assert lx[1].cpu().tolist() == [-10.0, 50.0, 60.0, 70.0]
    assert ltail[:3].cpu().tolist() == [50.0, 60.0, 70.0]
    assert lt[3, 1].item() == 70.0
    assert torch.equal(x.cpu(), torch.arange(12.0).reshape(3, 4))  # the original is untouched


def test_slice_saved_alone_keeps_its_offset_and_values(dev):
    x = torch.arange(10.0, device=dev)
    loaded = roundtrip(x[3:7])
    assert loaded.storage_offset() == 3
    assert loaded.cpu().tolist() == [3.0, 4.0, 5.0, 6.0]
    loaded.fill_(0)
    assert x[3].item() == 3.0


def test_non_contiguous_view_round_trips(dev):
    cpu = torch.randn(4, 6)
    loaded = roundtrip(cpu.to(dev)[:, ::2].t())
    assert torch.equal(loaded.cpu(), cpu[:, ::2].t())


def _trained_batchnorm(device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    bn = nn.BatchNorm2d(3)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5, generator=gen)
        bn.bias.uniform_(-0.5, 0.5, generator=gen)
    bn.to(device)
    for _ in range(3):
        bn(torch.randn(4, 3, 5, 5, generator=gen).to(device))
    return bn


def test_batchnorm_state_dict_round_trips_on_the_device(dev):
    bn = _trained_batchnorm(dev)
    state = bn.state_dict()
    assert set(state) == {"weight", "bias", "running_mean", "running_var", "num_batches_tracked"}

    loaded = roundtrip(state)
    fresh = nn.BatchNorm2d(3).to(dev)
    fresh.load_state_dict(loaded)
    for name, value in bn.state_dict().items():
        got = fresh.state_dict()[name]
        assert got.device == dev, name
        assert torch.equal(got.cpu(), value.cpu()), name
    assert fresh.num_batches_tracked.item() == 3

    x = torch.randn(2, 3, 5, 5)
    bn.eval()
    fresh.eval()
    assert torch.equal(fresh(x.to(dev)).cpu(), bn(x.to(dev)).cpu())


def test_batchnorm_state_matches_the_same_training_on_cpu(dev):
    on_device = _trained_batchnorm(dev).state_dict()
    on_cpu = _trained_batchnorm("cpu").state_dict()
    loaded = roundtrip(on_device, map_location="cpu")
    for name in on_cpu:
        assert loaded[name].device.type == "cpu"
        torch.testing.assert_close(loaded[name], on_cpu[name])


def test_cpu_checkpoint_loads_onto_the_device_with_map_location(dev):
    torch.manual_seed(1)
    cpu_model = nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))
    cpu_model(torch.randn(8, 6))  # move the running statistics
    cpu_model.eval()

    state = roundtrip(cpu_model.state_dict(), map_location=dev)
    assert all(v.device == dev for v in state.values())

    dev_model = nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2)).to(dev)
    dev_model.load_state_dict(state)
    dev_model.eval()
    x = torch.randn(5, 6)
    torch.testing.assert_close(dev_model(x.to(dev)).cpu(), cpu_model(x))


def test_whole_module_saved_on_device_loads_on_cpu(dev):
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)).to(dev)
    model(torch.randn(4, 3, device=dev))
    model.eval()
    loaded = roundtrip(model, map_location="cpu", weights_only=False)
    assert all(p.device.type == "cpu" for p in loaded.state_dict().values())
    x = torch.randn(2, 3)
    torch.testing.assert_close(loaded(x), model(x.to(dev)).cpu())


def test_bfloat16_round_trips_bit_exactly(dev):
    cpu = torch.randn(64).to(torch.bfloat16)
    for location in (None, dev, "cpu"):
        loaded = roundtrip(cpu.to(dev), map_location=location)
        assert loaded.dtype == torch.bfloat16
        assert torch.equal(loaded.cpu().view(torch.int16), cpu.view(torch.int16))
    copied = copy.deepcopy(cpu.to(dev))
    assert copied.dtype == torch.bfloat16
    assert torch.equal(copied.cpu().view(torch.int16), cpu.view(torch.int16))


def test_bfloat16_module_state_round_trips(dev):
    model = nn.Linear(4, 4).to(dev).to(torch.bfloat16)
    loaded = roundtrip(model.state_dict())
    for name, value in model.state_dict().items():
        assert loaded[name].dtype == torch.bfloat16
        assert torch.equal(loaded[name].cpu(), value.cpu())


def test_deepcopy_of_a_tensor_is_equal_and_independent(dev):
    x = torch.randn(3, 4, device=dev)
    y = copy.deepcopy(x)
    assert y.device == dev
    assert torch.equal(y.cpu(), x.cpu())
    assert y.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    before = x.cpu()
    y.add_(1)
    assert torch.equal(x.cpu(), before)


def test_deepcopy_keeps_requires_grad_of_a_leaf(dev):
    w = torch.randn(3, device=dev, requires_grad=True)
    c = copy.deepcopy(w)
    assert c.requires_grad and c.is_leaf
    (c * 2).sum().backward()
    assert w.grad is None
    assert torch.equal(c.grad.cpu(), torch.full((3,), 2.0))


def test_deepcopy_of_views_in_one_container_keeps_sharing_and_drops_the_original(dev):
    x = torch.arange(6.0, device=dev).reshape(2, 3)
    pair = copy.deepcopy({"a": x, "b": x.t(), "c": x[1]})
    a, b, c = pair["a"], pair["b"], pair["c"]
    assert torch.equal(b.cpu(), a.cpu().t())
    assert c.storage_offset() == 3

    b[2, 0] = 100.0  # element (0, 2) of a
    assert a[0, 2].item() == 100.0
    c.zero_()
    assert a[1].cpu().tolist() == [0.0, 0.0, 0.0]
    assert torch.equal(x.cpu(), torch.arange(6.0).reshape(2, 3))

    x.fill_(7.0)  # and the other way: the copy does not see the original's writes
    assert a[0, 0].item() == 0.0


def test_deepcopy_of_a_batchnorm_module(dev):
    bn = _trained_batchnorm(dev)
    clone = copy.deepcopy(bn)
    assert isinstance(clone.weight, nn.Parameter)
    for (name, value), (_, copied) in zip(bn.state_dict().items(), clone.state_dict().items()):
        assert copied.device == dev, name
        assert torch.equal(copied.cpu(), value.cpu()), name
        assert copied.untyped_storage().data_ptr() != value.untyped_storage().data_ptr(), name

    mean_before = bn.running_mean.cpu()
    clone(torch.randn(4, 3, 5, 5, device=dev) + 3)  # training step on the copy only
    assert torch.equal(bn.running_mean.cpu(), mean_before)
    assert not torch.equal(clone.running_mean.cpu(), mean_before)
    assert clone.num_batches_tracked.item() == bn.num_batches_tracked.item() + 1


def test_deepcopy_keeps_tied_weights_tied(dev):
    model = nn.Sequential(nn.Linear(3, 3, bias=False), nn.Linear(3, 3, bias=False)).to(dev)
    model[1].weight = model[0].weight
    clone = copy.deepcopy(model)
    assert clone[1].weight is clone[0].weight
    assert clone[0].weight is not model[0].weight
    assert torch.equal(clone[0].weight.detach().cpu(), model[0].weight.detach().cpu())


def test_empty_tensor_round_trips(dev):
    e = torch.empty(0, 3, device=dev)
    assert roundtrip(e).shape == (0, 3)
    assert roundtrip(e).device == dev
    assert copy.deepcopy(e).shape == (0, 3)


def test_loaded_and_copied_tensors_release_device_memory(dev, no_gc):
    x = torch.randn(256, 256, device=dev)
    base = torch.ref.memory_allocated()
    objs = [roundtrip({"x": x, "t": x.t()}), copy.deepcopy([x, x[1:]])]
    grown = torch.ref.memory_allocated() - base
    assert grown >= 2 * x.nbytes  # one storage per container: the views did not duplicate it
    assert grown < 3 * x.nbytes
    del objs
    assert torch.ref.memory_allocated() == base


# -- storage locations ---------------------------------------------------------------------------


def _pickled_str(text: str) -> bytes:
    """How ``torch.save``'s pickle (protocol 2) writes a str: BINUNICODE, 4-byte length."""
    data = text.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def saved_at(obj, location: str, dev) -> io.BytesIO:
    """``torch.save(obj)`` with every storage location tag (``ref:0``) rewritten to ``location``,
    as a checkpoint from another machine or a tampered file would carry."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    tag = f"{dev.type}:0"
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as zin, zipfile.ZipFile(out, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename.endswith("data.pkl"):
                assert data.count(_pickled_str(tag)) == 1, "one storage, tagged once"
                data = data.replace(_pickled_str(tag), _pickled_str(location))
            zout.writestr(item, data)
    out.seek(0)
    return out


FIX = (
    "Please use torch.load with map_location to map your storages to an existing device "
    "(e.g. map_location='ref:0', or map_location='cpu')."
)


@pytest.mark.parametrize("location", ["ref:0", "ref"])
@pytest.mark.parametrize("map_location", [None, "cpu", "device"])
def test_a_location_naming_this_backend_loads(dev, location, map_location):
    cpu = torch.randn(2, 3)
    loaded = torch.load(saved_at(cpu.to(dev), location, dev), map_location=_map(map_location, dev))
    assert loaded.device == (torch.device("cpu") if map_location == "cpu" else dev)
    assert torch.equal(loaded.cpu(), cpu)


@pytest.mark.parametrize(
    "location, message",
    [
        ("ref:7", f"Attempting to deserialize object on REF device 7 but torch.ref.device_count() is 1. {FIX}"),
        ("ref:1", f"Attempting to deserialize object on REF device 1 but torch.ref.device_count() is 1. {FIX}"),
        *[
            (bad, f"Attempting to deserialize object on an invalid REF location {bad!r}: a ref storage "
                  "location is 'ref' or 'ref:<index>' with an index below torch.ref.device_count(), "
                  f"which is 1. {FIX}")
            for bad in ["refzz", "ref:0:../x", "ref:-1", "ref:", "ref:01", "ref0", "refzz:0"]
        ],
        ("tpu:0", "Attempting to deserialize object on a 'tpu' device (storage location 'tpu:0'), but "
                  f"this process runs 'ref': accelkit activates one backend per process. {FIX}"),
    ],
)
def test_a_location_that_is_not_an_existing_device_of_this_backend_is_refused(dev, location, message):
    cpu = torch.randn(4)
    with pytest.raises(RuntimeError) as err:
        torch.load(saved_at({"w": cpu.to(dev)}, location, dev))
    assert str(err.value) == message
    # The fix the message names works, and the process is fine afterwards.
    for target in ("cpu", dev):
        loaded = torch.load(saved_at({"w": cpu.to(dev)}, location, dev), map_location=target)
        assert loaded["w"].device == torch.device(target) and torch.equal(loaded["w"].cpu(), cpu)
    assert torch.equal((torch.ones(2, device=dev) * 2).cpu(), torch.full((2,), 2.0))


@pytest.mark.parametrize("target", ["ref:7", "refzz", "ref:0:../x", torch.device("ref", 3)])
def test_a_map_location_that_is_not_an_existing_device_is_refused(dev, target):
    with pytest.raises(RuntimeError, match="Attempting to deserialize object on (REF device|an invalid REF)"):
        roundtrip(torch.randn(3).to(dev), map_location=target)
    with pytest.raises(RuntimeError, match="REF device 7 but torch.ref.device_count"):
        roundtrip(torch.randn(3).to(dev), map_location={"ref:0": "ref:7"})


def test_locations_of_other_devices_are_left_to_pytorch(dev):
    from accelkit import _runtime
    from accelkit._runtime.device.serialization import location_index

    ctx = _runtime.active()
    assert [location_index(ctx, loc) for loc in ("cpu", "cuda:0", "meta", "mps", "xla:1")] == [None] * 5
    assert [location_index(ctx, loc) for loc in ("ref", "ref:0")] == [0, 0]
    cpu = torch.randn(3)
    assert torch.equal(torch.load(saved_at(cpu.to(dev), "cpu", dev)), cpu)
