"""tpu FFT (kernels/fft.py: ``_fft_r2c``/``_fft_c2c``/``_fft_c2r``) against CPU: real and complex
transforms and their inverses under every norm, n-dimensional transforms over chosen dims,
padding and cropping lengths, Hermitian transforms and a round trip. Complex-number lowerings
(angle, complex, polar) are in ``test_tpu_complex.py``.

Each check runs one ``torch.fft`` call on CPU and on a tpu copy of the input (some of them
non-contiguous), compares the values and dtypes, and asserts the aten ops ran natively.
"""

from __future__ import annotations

import pytest
import torch

from harness_complex import TOL, check, cplx, real


@pytest.mark.parametrize("norm", [None, "forward", "ortho"])
def test_rfft_and_irfft_each_norm(dev, norm):
    x = real((3, 10))
    check(dev, lambda t: torch.fft.rfft(t, norm=norm), x, "aten._fft_r2c.default")
    check(dev, lambda t: torch.fft.irfft(t, n=10, norm=norm), torch.fft.rfft(x), "aten._fft_c2r.default")


@pytest.mark.parametrize("norm", [None, "forward", "ortho"])
def test_complex_fft_and_ifft_each_norm(dev, norm):
    x = cplx((4, 6))
    check(dev, lambda t: torch.fft.fft(t, norm=norm), x, "aten._fft_c2c.default")
    check(dev, lambda t: torch.fft.ifft(t, norm=norm), x, "aten._fft_c2c.default")


def test_fft_of_real_input_is_full_spectrum(dev):
    check(dev, torch.fft.fft, real((5, 7)), "aten._fft_r2c.default")
    check(dev, torch.fft.ifft, real((5, 7)), "aten._fft_r2c.default")


def test_fftn_over_chosen_dims_of_a_transposed_input(dev):
    x = cplx((6, 4, 5)).transpose(0, 2)
    check(dev, lambda t: torch.fft.fftn(t, dim=(0, 2)), x, "aten._fft_c2c.default")


def test_rfft2_and_irfft2_with_odd_last_size(dev):
    x = real((2, 6, 9))
    check(dev, torch.fft.rfft2, x, "aten._fft_r2c.default")
    check(dev, lambda t: torch.fft.irfft2(t, s=(6, 9)), torch.fft.rfft2(x), "aten._fft_c2r.default")


def test_padding_and_cropping_length(dev):
    x = real((8,))
    check(dev, lambda t: torch.fft.rfft(t, n=12), x, "aten._fft_r2c.default")
    check(dev, lambda t: torch.fft.fft(t, n=5), cplx((8,)), "aten._fft_c2c.default")


def test_hfft_and_ihfft(dev):
    check(dev, lambda t: torch.fft.hfft(t, n=8), cplx((5,)), "aten._fft_c2r.default")
    check(dev, torch.fft.ihfft, real((3, 8)), "aten._fft_r2c.default")


def test_round_trip_recovers_input(dev):
    x = real((4, 16)).to(dev)
    back = torch.fft.irfft(torch.fft.rfft(x), n=16)
    torch.testing.assert_close(back.cpu(), x.cpu(), **TOL)
