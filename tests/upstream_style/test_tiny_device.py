"""A device-generic test file written as PyTorch writes its own (``test/test_*.py``): the
conformance runner's ``upstream`` suite is tested on it, since CI has no PyTorch checkout."""

import os

import torch
from torch.testing._internal.common_device_type import dtypes, instantiate_device_type_tests, onlyCUDA
from torch.testing._internal.common_utils import TestCase, run_tests


class TestTiny(TestCase):
    def test_add(self, device):
        x = torch.arange(4.0, device=device)
        self.assertEqual(x + x, torch.arange(4.0) * 2)

    @dtypes(torch.float32, torch.int64)
    def test_mul(self, device, dtype):
        x = torch.arange(4, device=device, dtype=dtype)
        self.assertEqual((x * 3).cpu(), torch.arange(4, dtype=dtype) * 3)

    def test_wrong_answer(self, device):
        self.assertEqual(torch.ones(2, device=device).sum().item(), 3.0)

    def test_declared_gap(self, device):
        self.assertEqual(torch.zeros(1, device=device).item(), 1.0)

    def test_crash(self, device):
        if os.environ.get("ACCELKIT_TINY_CRASH"):
            os.abort()

    @onlyCUDA
    def test_cuda_only(self, device):
        self.assertEqual(torch.ones(1, device=device).item(), 1.0)


instantiate_device_type_tests(TestTiny, globals())

if __name__ == "__main__":
    run_tests()
