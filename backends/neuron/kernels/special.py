"""Special functions (``torch.special``): Bessel and Airy functions, ndtri, erfcx and the
classical orthogonal polynomials.

Each is an elementwise program in fp32: the polynomial and rational approximations and the
three-term recurrences run on the Vector engine, exp/log/sqrt/sin/cos/acos on the Scalar
engine's activation tables. They follow CPU PyTorch's kernels (``ATen/native/Math.h``) step by
step — the same published Cephes coefficients rounded to fp32, the same branch points, the same
order of operations — so float32 results agree to a few ulps (the activation tables and the
CPU's libm differ in the last bit, and a long recurrence or a cancelling sum amplifies that).

Branches are computed for every element and chosen with ``select``, as a SIMD engine must; an
unselected branch's NaN or infinity never reaches the result.

Where the CPU has a bfloat16/float16 kernel (``i0e``, ``i1``, ``i1e``) it computes in fp32 and
rounds once; so does this program. Where it has none, the program declines and the CPU raises
its error. ``erfcx`` is a composition rather than the CPU's table (see :func:`_erfcx`).
Hurwitz ``zeta`` is the CPU's Euler–Maclaurin summation, whose float kernel sums in double
precision: here float32 stays within 1.5 ulps of the exact value through the order of its sums,
exact shifts and the pairing of a negative ``q``'s cancelling terms (see :func:`_zeta`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from accelkit.sdk import KernelDeclined
from accelkit_backends.neuron.launch import OutSpec, chip_dtype, hbm_empty, tile_kernel
from accelkit_backends.neuron.sim.isa import Kernel
from accelkit_backends.neuron.sim.memory import Tile
from accelkit_backends.neuron.tiling import FlatMap, map_flat_fused

aten = torch.ops.aten
_F32 = np.float32
#: Free elements per partition in one chunk: a Bessel function keeps some twenty fp32
#: temporaries live, which must fit in SBUF beside the streamed operands.
_COLUMNS = 512
#: The highest degree a recurrence is unrolled to; beyond it the program declines (the CPU's
#: loop runs per element, a device program would run the longest one for every element).
MAX_DEGREE = 512
_PI_4 = 0.785398163397448309615660845819875721
_3PI_4 = 2.356194490192344928846982537459627163
_SQRT_2_PI = 0.797884560802865355879892119868763737
_2_PI = 0.636619772367581343075535053490057448


class _Fp32:
    """fp32 arithmetic on tiles of one chunk's shape; operands are tiles or numbers."""

    def __init__(self, k: Kernel, shape: tuple[int, ...]):
        self.k, self.shape = k, shape

    def new(self, name: str = "t") -> Tile:
        return self.k.sbuf(self.shape, _F32, name)

    def op(self, a: Any, op: str, b: Any, into: Tile | None = None) -> Tile:
        dst = into if into is not None else self.new(op)
        if isinstance(a, Tile) and isinstance(b, Tile):
            self.k.tensor_tensor(dst, a, b, op)
        elif isinstance(a, Tile):
            self.k.tensor_scalar(dst, a, op, _F32(b))
        else:
            self.k.tensor_scalar(dst, b, op, _F32(a), reverse=True)
        return dst

    def add(self, a: Any, b: Any, into: Tile | None = None) -> Tile:
        return self.op(a, "add", b, into)

    def sub(self, a: Any, b: Any, into: Tile | None = None) -> Tile:
        return self.op(a, "subtract", b, into)

    def mul(self, a: Any, b: Any, into: Tile | None = None) -> Tile:
        return self.op(a, "multiply", b, into)

    def div(self, a: Any, b: Any, into: Tile | None = None) -> Tile:
        return self.op(a, "divide", b, into)

    def act(self, func: str, a: Tile, into: Tile | None = None) -> Tile:
        dst = into if into is not None else self.new(func)
        self.k.activation(dst, a, func)
        return dst

    def test(self, a: Tile, op: str, b: Any, into: Tile | None = None) -> Tile:
        """A 0/1 mask (NaN compares false, as in C)."""
        mask = into if into is not None else self.k.sbuf(self.shape, np.uint8, op)
        if isinstance(b, Tile):
            self.k.tensor_tensor(mask, a, b, op)
        else:
            self.k.tensor_scalar(mask, a, op, _F32(b))
        return mask

    def both(self, a: Tile, b: Tile) -> Tile:
        mask = self.k.sbuf(self.shape, np.uint8, "and")
        self.k.tensor_tensor(mask, a, b, "logical_and")
        return mask

    def either(self, a: Tile, b: Tile) -> Tile:
        mask = self.k.sbuf(self.shape, np.uint8, "or")
        self.k.tensor_tensor(mask, a, b, "logical_or")
        return mask

    def where(self, mask: Tile, a: Any, b: Any, into: Tile | None = None) -> Tile:
        dst = into if into is not None else self.new("select")
        self.k.select(dst, mask, _F32(a) if not isinstance(a, Tile) else a,
                      _F32(b) if not isinstance(b, Tile) else b)
        return dst

    def fp32(self, src: Tile) -> Tile:
        """``src`` widened to the chunk's shape (a one-element input) and converted to fp32."""
        dst = self.new("x")
        if src.shape == self.shape:
            self.k.tensor_copy(dst, src)
        else:
            self.k.memset(dst, 0)
            self.k.tensor_scalar(dst, dst, "add", src)
        return dst

    def polevl(self, z: Tile, coefficients: Sequence[float]) -> Tile:
        """``c[0] z^n + ... + c[n]`` by Horner's rule (Cephes ``polevl``), in one tile."""
        acc = self.new("poly")
        self.k.memset(acc, _F32(coefficients[0]))
        for c in coefficients[1:]:
            self.mul(acc, z, into=acc)
            self.add(acc, c, into=acc)
        return acc

    def chbevl(self, y: Tile, coefficients: Sequence[float]) -> Tile:
        """The Chebyshev series ``sum' c[i] T_i(y/2)`` by Clenshaw's recurrence (Cephes
        ``chbevl``): ``b0 = y*b1 - b2 + c``; the result is ``0.5 * (b0 - b2)``. Three tiles."""
        b0, b1, b2 = self.new("b0"), self.new("b1"), self.new("b2")
        self.k.memset(b0, _F32(coefficients[0]))
        self.k.memset(b1, 0)
        self.k.memset(b2, 0)
        for c in coefficients[1:]:
            b0, b1, b2 = b2, b0, b1  # the oldest buffer takes the new b0
            self.mul(y, b1, into=b0)
            self.sub(b0, b2, into=b0)
            self.add(b0, c, into=b0)
        self.sub(b0, b2, into=b0)
        return self.mul(b0, 0.5, into=b0)


def _elementwise(k: Kernel, out: OutSpec, inputs: list[np.ndarray],
                 compute: Callable[[_Fp32, list[Tile]], Tile]) -> np.ndarray:
    """Run ``compute(f, srcs) -> fp32 tile`` over ``out`` in chunks of :data:`_COLUMNS`; the
    result is rounded once into the output's dtype."""
    result = hbm_empty(out)

    def chunk(dst: Tile, srcs: list[Tile]) -> None:
        with k.scope():
            f = _Fp32(k, dst.shape)
            k.tensor_copy(dst, compute(f, srcs))

    flat = FlatMap(result, inputs, chunk, chip_dtype(result.dtype))
    map_flat_fused(k, [flat], [True], fmax=_COLUMNS)
    return result


def _require(out: OutSpec, name: str, narrow: bool = False) -> None:
    """Decline the dtypes the CPU kernel does not compute (its error, through the fallback)."""
    allowed = (torch.float32, torch.float64) + ((torch.bfloat16, torch.float16) if narrow else ())
    if out.dtype not in allowed:
        raise KernelDeclined(f"neuron {name}: the CPU kernel has no {out.dtype} form")


# ---------------------------------------------------------------------------------------------
# Bessel functions of the first and second kind (Cephes j0.c, j1.c)
# ---------------------------------------------------------------------------------------------

_J0_PP = (7.96936729297347051624e-04, 8.28352392107440799803e-02, 1.23953371646414299388e+00,
          5.44725003058768775090e+00, 8.74716500199817011941e+00, 5.30324038235394892183e+00,
          9.99999999999999997821e-01)
_J0_PQ = (9.24408810558863637013e-04, 8.56288474354474431428e-02, 1.25352743901058953537e+00,
          5.47097740330417105182e+00, 8.76190883237069594232e+00, 5.30605288235394617618e+00,
          1.00000000000000000218e+00)
_J0_QP = (-1.13663838898469149931e-02, -1.28252718670509318512e+00, -1.95539544257735972385e+01,
          -9.32060152123768231369e+01, -1.77681167980488050595e+02, -1.47077505154951170175e+02,
          -5.14105326766599330220e+01, -6.05014350600728481186e+00)
_J0_QQ = (6.43178256118178023184e+01, 8.56430025976980587198e+02, 3.88240183605401609683e+03,
          7.24046774195652478189e+03, 5.93072701187316984827e+03, 2.06209331660327847417e+03,
          2.42005740240291393179e+02)
_J0_RP = (-4.79443220978201773821e+09, 1.95617491946556577543e+12, -2.49248344360967716204e+14,
          9.70862251047306323952e+15)
_J0_RQ = (1.0, 4.99563147152651017219e+02, 1.73785401676374683123e+05, 4.84409658339962045305e+07,
          1.11855537045356834862e+10, 2.11277520115489217587e+12, 3.10518229857422583814e+14,
          3.18121955943204943306e+16, 1.71086294081043136091e+18)
_Y0_YP = (1.55924367855235737965e+04, -1.46639295903971606143e+07, 5.43526477051876500413e+09,
          -9.82136065717911466409e+11, 8.75906394395366999549e+13, -3.46628303384729719441e+15,
          4.42733268572569800351e+16, -1.84950800436986690637e+16)
_Y0_YQ = (1.0, 1.04128353664259848412e+03, 6.26107330137134956842e+05, 2.68919633393814121987e+08,
          8.64002487103935000337e+10, 2.02979612750105546709e+13, 3.17157752842975028269e+15,
          2.50596256172653059228e+17)

_J1_PP = (7.62125616208173112003e-04, 7.31397056940917570436e-02, 1.12719608129684925192e+00,
          5.11207951146807644818e+00, 8.42404590141772420927e+00, 5.21451598682361504063e+00,
          1.00000000000000000254e+00)
_J1_PQ = (5.71323128072548699714e-04, 6.88455908754495404082e-02, 1.10514232634061696926e+00,
          5.07386386128601488557e+00, 8.39985554327604159757e+00, 5.20982848682361821619e+00,
          9.99999999999999997461e-01)
_J1_QP = (5.10862594750176621635e-02, 4.98213872951233449420e+00, 7.58238284132545283818e+01,
          3.66779609360150777800e+02, 7.10856304998926107277e+02, 5.97489612400613639965e+02,
          2.11688757100572135698e+02, 2.52070205858023719784e+01)
_J1_QQ = (7.42373277035675149943e+01, 1.05644886038262816351e+03, 4.98641058337653607651e+03,
          9.56231892404756170795e+03, 7.99704160447350683650e+03, 2.82619278517639096600e+03,
          3.36093607810698293419e+02)
_J1_RP = (-8.99971225705559398224e+08, 4.52228297998194034323e+11, -7.27494245221818276015e+13,
          3.68295732863852883286e+15)
_J1_RQ = (1.0, 6.20836478118054335476e+02, 2.56987256757748830383e+05, 8.35146791431949253037e+07,
          2.21511595479792499675e+10, 4.74914122079991414898e+12, 7.84369607876235854894e+14,
          8.95222336184627338078e+16, 5.32278620332680085395e+18)
_Y1_YP = (1.26320474790178026440e+09, -6.47355876379160291031e+11, 1.14509511541823727583e+14,
          -8.12770255501325109621e+15, 2.02439475713594898196e+17, -7.78877196265950026825e+17)
_Y1_YQ = (1.0, 5.94301592346128195359e+02, 2.35564092943068577943e+05, 7.34811944459721705660e+07,
          1.87601316108706159478e+10, 3.88231277496238566008e+12, 6.20557727146953693363e+14,
          6.87141087355300489866e+16, 3.97270608116560655612e+18)


def _hankel(f: _Fp32, ax: Tile, w: Tile, order: int, second_kind: bool) -> Tile:
    """The large-argument form (x > 5) of J_order or Y_order on ``ax`` with ``w = (5/x)^2``:
    ``(P cos(x - phase) -+ 5/x Q sin(x - phase)) sqrt(2/pi) / sqrt(x)`` (sin and cos trade
    places for Y)."""
    pp, pq, qp, qq = (_J0_PP, _J0_PQ, _J0_QP, _J0_QQ) if order == 0 else (_J1_PP, _J1_PQ, _J1_QP, _J1_QQ)
    p = f.div(f.polevl(w, pp), f.polevl(w, pq))
    q = f.div(f.polevl(w, qp), f.polevl(w, qq))
    shifted = f.sub(ax, _PI_4 if order == 0 else _3PI_4)
    cos, sin = f.act("cos", shifted), f.act("sin", shifted)
    first, second = (sin, cos) if second_kind else (cos, sin)
    q_term = f.mul(f.mul(f.div(5.0, ax), q), second)
    total = f.add(f.mul(p, first), q_term) if second_kind else f.sub(f.mul(p, first), q_term)
    return f.div(f.mul(total, _SQRT_2_PI), f.act("sqrt", ax))


def _hankel_w(f: _Fp32, ax: Tile, order: int) -> Tile:
    """``25 / x^2`` as the CPU forms it for each order (``5/x * (5/x)`` for order 1)."""
    if order == 0:
        return f.div(25.0, f.mul(ax, ax))
    five_over = f.div(5.0, ax)
    return f.mul(five_over, five_over)


def _j0(f: _Fp32, x: Tile) -> Tile:
    ax = f.act("abs", x)
    z = f.mul(ax, ax)
    rational = f.div(f.polevl(z, _J0_RP), f.polevl(z, _J0_RQ))
    near = f.mul(f.mul(f.sub(z, 5.78318596294678452118e+00), f.sub(z, 3.04712623436620863991e+01)), rational)
    tiny = f.sub(1.0, f.div(z, 4.0))
    near = f.where(f.test(ax, "less", 1e-5), tiny, near, into=near)
    far = _hankel(f, ax, _hankel_w(f, ax, 0), 0, second_kind=False)
    return f.where(f.test(ax, "less_equal", 5.0), near, far)


def _j1(f: _Fp32, x: Tile) -> Tile:
    z = f.mul(x, x)
    rational = f.div(f.polevl(z, _J1_RP), f.polevl(z, _J1_RQ))
    near = f.mul(f.mul(f.mul(rational, x), f.sub(z, 1.46819706421238932572e+01)),
                 f.sub(z, 4.92184563216946036703e+01))
    ax = f.act("abs", x)
    far = _hankel(f, ax, _hankel_w(f, ax, 1), 1, second_kind=False)
    far = f.where(f.test(x, "less", 0.0), f.mul(far, -1.0), far, into=far)
    return f.where(f.test(ax, "less_equal", 5.0), near, far)


def _y0(f: _Fp32, x: Tile) -> Tile:
    z = f.mul(x, x)
    rational = f.div(f.polevl(z, _Y0_YP), f.polevl(z, _Y0_YQ))
    near = f.add(rational, f.mul(f.mul(f.act("log", x), _2_PI), _j0(f, x)))
    near = f.where(f.test(x, "less", 0.0), float("nan"), near, into=near)
    near = f.where(f.test(x, "equal", 0.0), -float("inf"), near, into=near)
    far = _hankel(f, x, _hankel_w(f, x, 0), 0, second_kind=True)
    return f.where(f.test(x, "less_equal", 5.0), near, far)


def _y1(f: _Fp32, x: Tile) -> Tile:
    z = f.mul(x, x)
    rational = f.div(f.polevl(z, _Y1_YP), f.polevl(z, _Y1_YQ))
    log_term = f.sub(f.mul(_j1(f, x), f.act("log", x)), f.div(1.0, x))
    near = f.add(f.mul(x, rational), f.mul(log_term, _2_PI))
    near = f.where(f.test(x, "less", 0.0), float("nan"), near, into=near)
    near = f.where(f.test(x, "equal", 0.0), -float("inf"), near, into=near)
    far = _hankel(f, x, _hankel_w(f, x, 1), 1, second_kind=True)
    return f.where(f.test(x, "less_equal", 5.0), near, far)


def _spherical_j0(f: _Fp32, x: Tile) -> Tile:
    z = f.mul(x, x)
    series = f.new("series")
    f.k.memset(series, _F32(1.0) / _F32(6227020800.0))
    for term in (-39916800.0, 362880.0, -5040.0, 120.0, -6.0):
        # 1 + z(-1/6 + z(1/120 + ...)): each constant is T(+-1) / T(n), formed in fp32
        f.mul(series, z, into=series)
        f.add(series, _F32(np.sign(term)) / _F32(abs(term)), into=series)
    f.mul(series, z, into=series)
    f.add(series, 1.0, into=series)
    sinc = f.div(f.act("sin", x), x)
    ax = f.act("abs", x)
    result = f.where(f.test(ax, "less", 0.5), series, sinc)
    return f.where(f.test(ax, "equal", float("inf")), 0.0, result, into=result)


# ---------------------------------------------------------------------------------------------
# Modified Bessel functions (Cephes i0.c, i1.c, k0.c, k1.c): Chebyshev series
# ---------------------------------------------------------------------------------------------

_I0_A = (-4.41534164647933937950e-18, 3.33079451882223809783e-17, -2.43127984654795469359e-16,
         1.71539128555513303061e-15, -1.16853328779934516808e-14, 7.67618549860493561688e-14,
         -4.85644678311192946090e-13, 2.95505266312963983461e-12, -1.72682629144155570723e-11,
         9.67580903537323691224e-11, -5.18979560163526290666e-10, 2.65982372468238665035e-09,
         -1.30002500998624804212e-08, 6.04699502254191894932e-08, -2.67079385394061173391e-07,
         1.11738753912010371815e-06, -4.41673835845875056359e-06, 1.64484480707288970893e-05,
         -5.75419501008210370398e-05, 1.88502885095841655729e-04, -5.76375574538582365885e-04,
         1.63947561694133579842e-03, -4.32430999505057594430e-03, 1.05464603945949983183e-02,
         -2.37374148058994688156e-02, 4.93052842396707084878e-02, -9.49010970480476444210e-02,
         1.71620901522208775349e-01, -3.04682672343198398683e-01, 6.76795274409476084995e-01)
_I0_B = (-7.23318048787475395456e-18, -4.83050448594418207126e-18, 4.46562142029675999901e-17,
         3.46122286769746109310e-17, -2.82762398051658348494e-16, -3.42548561967721913462e-16,
         1.77256013305652638360e-15, 3.81168066935262242075e-15, -9.55484669882830764870e-15,
         -4.15056934728722208663e-14, 1.54008621752140982691e-14, 3.85277838274214270114e-13,
         7.18012445138366623367e-13, -1.79417853150680611778e-12, -1.32158118404477131188e-11,
         -3.14991652796324136454e-11, 1.18891471078464383424e-11, 4.94060238822496958910e-10,
         3.39623202570838634515e-09, 2.26666899049817806459e-08, 2.04891858946906374183e-07,
         2.89137052083475648297e-06, 6.88975834691682398426e-05, 3.36911647825569408990e-03,
         8.04490411014108831608e-01)
_I1_A = (2.77791411276104639959e-18, -2.11142121435816608115e-17, 1.55363195773620046921e-16,
         -1.10559694773538630805e-15, 7.60068429473540693410e-15, -5.04218550472791168711e-14,
         3.22379336594557470981e-13, -1.98397439776494371520e-12, 1.17361862988909016308e-11,
         -6.66348972350202774223e-11, 3.62559028155211703701e-10, -1.88724975172282928790e-09,
         9.38153738649577178388e-09, -4.44505912879632808065e-08, 2.00329475355213526229e-07,
         -8.56872026469545474066e-07, 3.47025130813767847674e-06, -1.32731636560394358279e-05,
         4.78156510755005422638e-05, -1.61760815825896745588e-04, 5.12285956168575772895e-04,
         -1.51357245063125314899e-03, 4.15642294431288815669e-03, -1.05640848946261981558e-02,
         2.47264490306265168283e-02, -5.29459812080949914269e-02, 1.02643658689847095384e-01,
         -1.76416518357834055153e-01, 2.52587186443633654823e-01)
_I1_B = (7.51729631084210481353e-18, 4.41434832307170791151e-18, -4.65030536848935832153e-17,
         -3.20952592199342395980e-17, 2.96262899764595013876e-16, 3.30820231092092828324e-16,
         -1.88035477551078244854e-15, -3.81440307243700780478e-15, 1.04202769841288027642e-14,
         4.27244001671195135429e-14, -2.10154184277266431302e-14, -4.08355111109219731823e-13,
         -7.19855177624590851209e-13, 2.03562854414708950722e-12, 1.41258074366137813316e-11,
         3.25260358301548823856e-11, -1.89749581235054123450e-11, -5.58974346219658380687e-10,
         -3.83538038596423702205e-09, -2.63146884688951950684e-08, -2.51223623787020892529e-07,
         -3.88256480887769039346e-06, -1.10588938762623716291e-04, -9.76109749136146840777e-03,
         7.78576235018280120474e-01)
#: ``special.i1``/``i1e`` in single precision use the tails of the series (CPU's float form).
_I1_A_FLOAT = _I1_A[12:]
_I1_B_FLOAT = _I1_B[18:]
_K0_A = (1.37446543561352307156e-16, 4.25981614279661018399e-14, 1.03496952576338420167e-11,
         1.90451637722020886025e-09, 2.53479107902614945675e-07, 2.28621210311945178607e-05,
         1.26461541144692592338e-03, 3.59799365153615016266e-02, 3.44289899924628486886e-01,
         -5.35327393233902768720e-01)
_K0_B = (5.30043377268626276149e-18, -1.64758043015242134646e-17, 5.21039150503902756861e-17,
         -1.67823109680541210385e-16, 5.51205597852431940784e-16, -1.84859337734377901440e-15,
         6.34007647740507060557e-15, -2.22751332699166985548e-14, 8.03289077536357521100e-14,
         -2.98009692317273043925e-13, 1.14034058820847496303e-12, -4.51459788337394416547e-12,
         1.85594911495471785253e-11, -7.95748924447710747776e-11, 3.57739728140030116597e-10,
         -1.69753450938905987466e-09, 8.57403401741422608519e-09, -4.66048989768794782956e-08,
         2.76681363944501510342e-07, -1.83175552271911948767e-06, 1.39498137188764993662e-05,
         -1.28495495816278026384e-04, 1.56988388573005337491e-03, -3.14481013119645005427e-02,
         2.44030308206595545468e+00)
_K1_A = (-7.02386347938628759343e-18, -2.42744985051936593393e-15, -6.66690169419932900609e-13,
         -1.41148839263352776110e-10, -2.21338763073472585583e-08, -2.43340614156596823496e-06,
         -1.73028895751305206302e-04, -6.97572385963986435018e-03, -1.22611180822657148235e-01,
         -3.53155960776544875667e-01, 1.52530022733894777053e+00)
_K1_B = (-5.75674448366501715755e-18, 1.79405087314755922667e-17, -5.68946255844285935196e-17,
         1.83809354436663880070e-16, -6.05704724837331885336e-16, 2.03870316562433424052e-15,
         -7.01983709041831346144e-15, 2.47715442448130437068e-14, -8.97670518232499435011e-14,
         3.34841966607842919884e-13, -1.28917396095102890680e-12, 5.13963967348173025100e-12,
         -2.12996783842756842877e-11, 9.21831518760500529508e-11, -4.19035475934189648750e-10,
         2.01504975519703286596e-09, -1.03457624656780970260e-08, 5.74108412545004946722e-08,
         -3.50196060308781257119e-07, 2.40648494783721712015e-06, -1.93619797416608296024e-05,
         1.95215518471351631108e-04, -2.85781685962277938680e-03, 1.03923736576817238437e-01,
         2.72062619048444266945e+00)


def _scaled_i(f: _Fp32, ax: Tile, near_series: Sequence[float], far_series: Sequence[float],
              times_x: bool) -> Tile:
    """``exp(-|x|) I_n(|x|)``: a series in ``|x|/2 - 2`` up to 8 (times ``|x|`` for order 1),
    one in ``32/|x| - 2`` divided by ``sqrt(|x|)`` beyond."""
    near = f.chbevl(f.sub(f.div(ax, 2.0), 2.0), near_series)
    if times_x:
        f.mul(near, ax, into=near)
    far = f.div(f.chbevl(f.sub(f.div(32.0, ax), 2.0), far_series), f.act("sqrt", ax))
    return f.where(f.test(ax, "less_equal", 8.0), near, far)


def _odd(f: _Fp32, x: Tile, value: Tile) -> Tile:
    return f.where(f.test(x, "less", 0.0), f.mul(value, -1.0), value, into=value)


def _i0e(f: _Fp32, x: Tile) -> Tile:
    return _scaled_i(f, f.act("abs", x), _I0_A, _I0_B, times_x=False)


def _i1e_float(f: _Fp32, x: Tile) -> Tile:
    return _odd(f, x, _scaled_i(f, f.act("abs", x), _I1_A_FLOAT, _I1_B_FLOAT, times_x=True))


def _i1_float(f: _Fp32, x: Tile) -> Tile:
    # CPU's order: exp(|x|) * |x| * series near zero, exp(|x|) * series / sqrt(|x|) beyond
    ax = f.act("abs", x)
    e = f.act("exp", ax)
    near = f.mul(f.mul(e, ax), f.chbevl(f.sub(f.div(ax, 2.0), 2.0), _I1_A_FLOAT))
    far = f.div(f.mul(e, f.chbevl(f.sub(f.div(32.0, ax), 2.0), _I1_B_FLOAT)), f.act("sqrt", ax))
    return _odd(f, x, f.where(f.test(ax, "less_equal", 8.0), near, far))


def _modified_i0(f: _Fp32, x: Tile) -> Tile:
    ax = f.act("abs", x)
    e = f.act("exp", ax)
    near = f.mul(e, f.chbevl(f.sub(f.div(ax, 2.0), 2.0), _I0_A))
    far = f.div(f.mul(e, f.chbevl(f.sub(f.div(32.0, ax), 2.0), _I0_B)), f.act("sqrt", ax))
    return f.where(f.test(ax, "less_equal", 8.0), near, far)


def _modified_i1(f: _Fp32, x: Tile) -> Tile:
    # CPU's order: 0.5 * (a - p) * |x| * exp(|x|) near zero, exp(|x|) * series / sqrt(|x|) beyond
    ax = f.act("abs", x)
    e = f.act("exp", ax)
    near = f.mul(f.mul(f.chbevl(f.sub(f.div(ax, 2.0), 2.0), _I1_A), ax), e)
    far = f.div(f.mul(e, f.chbevl(f.sub(f.div(32.0, ax), 2.0), _I1_B)), f.act("sqrt", ax))
    return _odd(f, x, f.where(f.test(ax, "less_equal", 8.0), near, far))


def _k(f: _Fp32, x: Tile, order: int, scaled: bool) -> Tile:
    """K_0/K_1 (times ``exp(x)`` when ``scaled``): ``x <= 2`` from a series in ``x^2 - 2`` and
    ``log(x/2) I_n(x)``, beyond from a series in ``8/x - 2`` over ``sqrt(x)``."""
    near_series, far_series = (_K0_A, _K0_B) if order == 0 else (_K1_A, _K1_B)
    series = f.chbevl(f.sub(f.mul(x, x), 2.0), near_series)
    log_half = f.act("log", f.mul(x, 0.5))
    if order == 0:
        near = f.sub(series, f.mul(log_half, _modified_i0(f, x)))
    else:
        near = f.add(f.mul(log_half, _modified_i1(f, x)), f.div(series, x))
    far = f.div(f.chbevl(f.sub(f.div(8.0, x), 2.0), far_series), f.act("sqrt", x))
    if scaled:
        f.mul(near, f.act("exp", x), into=near)
    else:
        f.mul(far, f.act("exp", f.mul(x, -1.0)), into=far)
    result = f.where(f.test(x, "less_equal", 2.0), near, far)
    f.where(f.test(x, "less", 0.0), float("nan"), result, into=result)
    return f.where(f.test(x, "equal", 0.0), float("inf"), result, into=result)


# ---------------------------------------------------------------------------------------------
# ndtri (Cephes ndtri.c): three rational approximations
# ---------------------------------------------------------------------------------------------

_NDTRI_P0 = (-5.99633501014107895267E1, 9.80010754185999661536E1, -5.66762857469070293439E1,
             1.39312609387279679503E1, -1.23916583867381258016E0)
_NDTRI_Q0 = (1.0, 1.95448858338141759834E0, 4.67627912898881538453E0, 8.63602421390890590575E1,
             -2.25462687854119370527E2, 2.00260212380060660359E2, -8.20372256168333339912E1,
             1.59056225126211695515E1, -1.18331621121330003142E0)
_NDTRI_P1 = (4.05544892305962419923E0, 3.15251094599893866154E1, 5.71628192246421288162E1,
             4.40805073893200834700E1, 1.46849561928858024014E1, 2.18663306850790267539E0,
             -1.40256079171354495875E-1, -3.50424626827848203418E-2, -8.57456785154685413611E-4)
_NDTRI_Q1 = (1.0, 1.57799883256466749731E1, 4.53907635128879210584E1, 4.13172038254672030440E1,
             1.50425385692907503408E1, 2.50464946208309415979E0, -1.42182922854787788574E-1,
             -3.80806407691578277194E-2, -9.33259480895457427372E-4)
_NDTRI_P2 = (3.23774891776946035970E0, 6.91522889068984211695E0, 3.93881025292474443415E0,
             1.33303460815807542389E0, 2.01485389549179081538E-1, 1.23716634817820021358E-2,
             3.01581553508235416007E-4, 2.65806974686737550832E-6, 6.23974539184983293730E-9)
_NDTRI_Q2 = (1.0, 6.02427039364742014255E0, 3.67983563856160859403E0, 1.37702099489081330271E0,
             2.16236993594496635890E-1, 1.34204006088543189037E-2, 3.28014464682127739104E-4,
             2.89247864745380683936E-6, 6.79019408009981274425E-9)
_EXP_MINUS_2 = 0.13533528323661269189


def _ndtri(f: _Fp32, p: Tile) -> Tile:
    upper = f.test(p, "greater", _F32(1.0) - _F32(_EXP_MINUS_2))
    y = f.where(upper, f.sub(1.0, p), p)
    # central: y - 1/2 + (y - 1/2) y2 P0(y2) / Q0(y2), times sqrt(2 pi)
    c = f.sub(y, 0.5)
    c2 = f.mul(c, c)
    ratio = f.div(f.mul(c2, f.polevl(c2, _NDTRI_P0)), f.polevl(c2, _NDTRI_Q0))
    central = f.mul(f.add(c, f.mul(c, ratio)), 2.50662827463100050242E0)
    # tails: x = sqrt(-2 log y); x - log(x)/x - z P(z)/Q(z), z = 1/x
    x = f.act("sqrt", f.mul(f.act("log", y), -2.0))
    x0 = f.sub(x, f.div(f.act("log", x), x))
    z = f.div(1.0, x)
    x1_near = f.div(f.mul(z, f.polevl(z, _NDTRI_P1)), f.polevl(z, _NDTRI_Q1))
    x1_far = f.div(f.mul(z, f.polevl(z, _NDTRI_P2)), f.polevl(z, _NDTRI_Q2))
    tail = f.sub(x0, f.where(f.test(x, "less", 8.0), x1_near, x1_far))
    tail = f.where(upper, tail, f.mul(tail, -1.0), into=tail)
    result = f.where(f.test(y, "greater", _EXP_MINUS_2), central, tail)
    f.where(f.both(f.test(p, "greater_equal", 0.0), f.test(p, "less_equal", 1.0)), result, float("nan"), into=result)
    f.where(f.test(p, "equal", 0.0), -float("inf"), result, into=result)
    return f.where(f.test(p, "equal", 1.0), float("inf"), result, into=result)


# ---------------------------------------------------------------------------------------------
# Airy Ai (Cephes airy.c): asymptotic rational forms outside [-2.09, 2.09), a series inside
# ---------------------------------------------------------------------------------------------

_AIRY_AN = (3.46538101525629032477e-01, 1.20075952739645805542e+01, 7.62796053615234516538e+01,
            1.68089224934630576269e+02, 1.59756391350164413639e+02, 7.05360906840444183113e+01,
            1.40264691163389668864e+01, 9.99999999999999995305e-01)
_AIRY_AD = (5.67594532638770212846e-01, 1.47562562584847203173e+01, 8.45138970141474626562e+01,
            1.77318088145400459522e+02, 1.64234692871529701831e+02, 7.14778400825575695274e+01,
            1.40959135607834029598e+01, 1.00000000000000000470e+00)
_AIRY_AFN = (-1.31696323418331795333e-01, -6.26456544431912369773e-01, -6.93158036036933542233e-01,
             -2.79779981545119124951e-01, -4.91900132609500318020e-02, -4.06265923594885404393e-03,
             -1.59276496239262096340e-04, -2.77649108155232920844e-06, -1.67787698489114633780e-08)
_AIRY_AFD = (1.33560420706553243746e+01, 3.26825032795224613948e+01, 2.67367040941499554804e+01,
             9.18707402907259625840e+00, 1.47529146771666414581e+00, 1.15687173795188044134e-01,
             4.40291641615211203805e-03, 7.54720348287414296618e-05, 4.51850092970580378464e-07)
_AIRY_AGN = (1.97339932091685679179e-02, 3.91103029615688277255e-01, 1.06579897599595591108e+00,
             9.39169229816650230044e-01, 3.51465656105547619242e-01, 6.33888919628925490927e-02,
             5.85804113048388458567e-03, 2.82851600836737019778e-04, 6.98793669997260967291e-06,
             8.11789239554389293311e-08, 3.41551784765923618484e-10)
_AIRY_AGD = (9.30892908077441974853e+00, 1.98352928718312140417e+01, 1.55646628932864612953e+01,
             5.47686069422975497931e+00, 9.54293611618961883998e-01, 8.64580826352392193095e-02,
             4.12656523824222607191e-03, 1.01259085116509135510e-04, 1.17166733214413521882e-06,
             4.91834570062930015649e-09)
_1_SQRT_PI = 5.64189583547756286948e-01
#: Terms of the series: inside [-2.09, 2.09) every element's terms fall below float32's epsilon
#: within ten; each element stops adding where the CPU's loop stops.
_AIRY_TERMS = 12


def _airy_ai(f: _Fp32, x: Tile) -> Tile:
    # x < -2.09: oscillating, 1/sqrt(pi) / x^(1/4) (sin(t) (1 + z^2 F) - cos(t) z G)
    minus_x = f.mul(x, -1.0)
    root = f.act("sqrt", minus_x)
    zeta_neg = f.div(f.mul(f.mul(x, -2.0), root), 3.0)
    z = f.div(1.0, zeta_neg)
    zz = f.mul(z, z)
    big_f = f.div(f.mul(zz, f.polevl(zz, _AIRY_AFN)), f.polevl(zz, _AIRY_AFD))
    big_g = f.div(f.mul(z, f.polevl(zz, _AIRY_AGN)), f.polevl(zz, _AIRY_AGD))
    t = f.add(zeta_neg, _F32(0.25) * _F32(np.pi))
    wave = f.sub(f.mul(f.act("sin", t), f.add(big_f, 1.0)), f.mul(f.act("cos", t), big_g))
    negative = f.mul(f.div(_1_SQRT_PI, f.act("sqrt", root)), wave)
    # x >= 2.09: decaying, 1/sqrt(pi) A(1/zeta) / (2 x^(1/4) exp(zeta))
    root_pos = f.act("sqrt", x)
    zeta = f.div(f.mul(f.mul(x, 2.0), root_pos), 3.0)
    inverse = f.div(1.0, zeta)
    ratio = f.div(f.polevl(inverse, _AIRY_AN), f.polevl(inverse, _AIRY_AD))
    denominator = f.mul(f.mul(f.act("sqrt", root_pos), 2.0), f.act("exp", zeta))
    positive = f.div(f.mul(ratio, _1_SQRT_PI), denominator)
    # |x| < 2.09: Ai = c1 f(x) - c2 g(x) by the Maclaurin series, summed until a term of f is
    # below float32's epsilon relative to f (the CPU's stopping rule, element by element)
    cube = f.mul(f.mul(x, x), x)
    m, n, series_f, series_g = f.new("m"), f.new("n"), f.new("f"), f.new("g")
    f.k.memset(m, 1.0)
    f.k.tensor_copy(n, x)
    f.k.memset(series_f, 1.0)
    f.k.tensor_copy(series_g, x)
    running = f.k.sbuf(f.shape, np.uint8, "running")
    f.k.memset(running, 1)
    t_mask = f.k.sbuf(f.shape, np.uint8, "converging")
    for i in range(1, _AIRY_TERMS + 1):
        f.div(f.mul(m, cube, into=m), float(3 * i - 1), into=m)
        f.div(f.mul(n, cube, into=n), float(3 * i), into=n)
        f.div(m, float(3 * i), into=m)
        f.where(running, f.add(series_f, m), series_f, into=series_f)
        f.div(n, float(3 * i + 1), into=n)
        f.where(running, f.add(series_g, n), series_g, into=series_g)
        ratio_t = f.act("abs", f.div(m, series_f))
        f.k.tensor_tensor(running, running, f.test(ratio_t, "greater", float(np.finfo(_F32).eps), into=t_mask),
                          "logical_and")
    series = f.sub(f.mul(series_f, 0.355028053887817239260), f.mul(series_g, 0.258819403792806798405))
    result = f.where(f.test(x, "less", -2.09), negative,
                     f.where(f.test(x, "greater_equal", 2.09), positive, series))
    f.where(f.test(x, "greater", 103.892), 0.0, result, into=result)
    return f.where(f.test(f.act("abs", x), "equal", float("inf")), float("nan"), result, into=result)


# ---------------------------------------------------------------------------------------------
# erfcx = exp(x^2) erfc(x): a composition exact to a few ulps
# ---------------------------------------------------------------------------------------------

#: From here on erfcx is its continued fraction (erfc itself would soon underflow); below, exp(x^2)
#: times the Scalar engine's erfc.
_ERFCX_FRACTION_FROM = 5.0
#: Levels of the continued fraction: at |x| >= 5 the truncation error is far below float32's.
_ERFCX_LEVELS = 14


def _erfcx(f: _Fp32, x: Tile) -> Tile:
    """Not the CPU's 100-interval table (a per-element table lookup), but a composition that is
    as accurate: ``exp(x^2) erfc(|x|)`` below 5, with ``x^2`` split exactly (``x = hi + lo``,
    ``hi`` on a 1/128 grid so ``hi^2`` is exact in fp32: ``exp(x^2) = exp(hi^2) exp(lo (2 hi +
    lo))``, where rounding ``x^2`` itself would cost ``x^2`` ulps); from 5 on the continued
    fraction ``1/sqrt(pi) / (x + (1/2) / (x + 1 / (x + (3/2) / ...)))``; for x < 0 the CPU's
    ``2 exp(x^2) - erfcx(-x)``, infinite below -26.7 as there."""
    ax = f.act("abs", x)
    hi = f.div(f.act("round", f.mul(ax, 128.0)), 128.0)
    lo = f.sub(ax, hi)
    exp_square = f.mul(f.act("exp", f.mul(hi, hi)), f.act("exp", f.mul(lo, f.add(f.add(hi, hi), lo))))
    near = f.mul(exp_square, f.act("erfc", ax))
    fraction = f.new("fraction")
    f.k.tensor_copy(fraction, ax)
    for level in range(_ERFCX_LEVELS, 0, -1):
        f.add(ax, f.div(level / 2.0, fraction), into=fraction)
    far = f.div(1.0 / np.sqrt(np.pi), fraction, into=fraction)
    positive = f.where(f.test(ax, "less", _ERFCX_FRACTION_FROM), near, far)
    negative = f.sub(f.mul(exp_square, 2.0), positive)
    result = f.where(f.test(x, "less", 0.0), negative, positive)
    return f.where(f.test(x, "less", -26.7), float("inf"), result, into=result)


def _register_unary(op_name: str, fn: Callable[[_Fp32, Tile], Tile], narrow: bool = False) -> None:
    """``op_name``'s kernel: ``fn`` on each chunk of the argument, in fp32; ``narrow``: the CPU
    also computes bfloat16/float16 (in float32, rounded once)."""
    op = getattr(aten, op_name).default

    def body(k: Kernel, out: list[OutSpec], x: np.ndarray) -> np.ndarray:
        _require(out[0], op_name, narrow)
        return _elementwise(k, out[0], [x], lambda f, srcs: fn(f, f.fp32(srcs[0])))

    body.__name__ = op_name
    tile_kernel(op, static=True)(body)


for _name, _fn in {
    "special_bessel_j0": _j0, "special_bessel_j1": _j1, "special_bessel_y0": _y0,
    "special_bessel_y1": _y1, "special_spherical_bessel_j0": _spherical_j0,
    "special_modified_bessel_i0": _modified_i0, "special_modified_bessel_i1": _modified_i1,
    "special_modified_bessel_k0": lambda f, x: _k(f, x, 0, scaled=False),
    "special_modified_bessel_k1": lambda f, x: _k(f, x, 1, scaled=False),
    "special_scaled_modified_bessel_k0": lambda f, x: _k(f, x, 0, scaled=True),
    "special_scaled_modified_bessel_k1": lambda f, x: _k(f, x, 1, scaled=True),
    "special_ndtri": _ndtri, "special_airy_ai": _airy_ai,
    "special_erfcx": _erfcx,
}.items():
    _register_unary(_name, _fn)
_register_unary("special_i0e", _i0e, narrow=True)
_register_unary("special_i1", _i1_float, narrow=True)
_register_unary("special_i1e", _i1e_float, narrow=True)


# ---------------------------------------------------------------------------------------------
# Orthogonal polynomials: three-term recurrences, unrolled to the largest degree asked for
# ---------------------------------------------------------------------------------------------

#: CPU's single-precision Hermite polynomials are NaN above this degree.
_HERMITE_LIMIT = 128


def _degrees(f: _Fp32, n: Tile, integral: bool) -> Tile:
    """``n`` as the CPU's ``int64_t`` degree, held in fp32: truncated toward zero; a NaN or
    infinite float degree counts as negative (x86 converts it to INT64_MIN)."""
    degree = f.fp32(n)
    if not integral:
        f.act("trunc", degree, into=degree)
        finite = f.test(f.act("abs", degree), "less", float("inf"))
        f.where(finite, degree, -1.0, into=degree)
    return degree


def _even(f: _Fp32, degree: Tile) -> Tile:
    return f.test(f.op(degree, "fmod", 2.0), "equal", 0.0)


def _recurrence(f: _Fp32, degree: Tile, highest: int, first: Tile,
                step: Callable[[Tile, Tile, int, Tile, Tile], None]) -> Tile:
    """P_n for every element's ``n``: 1 for n <= 0, ``first`` for n == 1, and for d = 2 ..
    ``highest`` the ``step(p, q, d, into, scratch)`` that forms P_d from P_{d-2} (``p``) and
    P_{d-1} (``q``). A NaN stays NaN through later steps, where the CPU stops its loop at it."""
    result = f.new("p_n")
    f.k.memset(result, 1.0)
    at = f.k.sbuf(f.shape, np.uint8, "at_degree")
    f.where(f.test(degree, "equal", 1.0, into=at), first, result, into=result)
    p, q, r, scratch = f.new("p"), f.new("q"), f.new("r"), f.new("scratch")
    f.k.memset(p, 1.0)
    f.k.tensor_copy(q, first)
    for d in range(2, highest + 1):
        step(p, q, d, r, scratch)
        p, q, r = q, r, p
        f.where(f.test(degree, "equal", float(d), into=at), q, result, into=result)
    return result


def _three_term(f: _Fp32, factor: Tile):
    """``r = factor * q - p`` (the Chebyshev recurrences)."""

    def step(p: Tile, q: Tile, d: int, into: Tile, scratch: Tile) -> None:
        f.mul(factor, q, into=into)
        f.sub(into, p, into=into)

    return step


def _odd_even_value(f: _Fp32, positive: Tile, even: Tile, when_true: Any, when_false: Any) -> Tile:
    return f.where(f.either(positive, even), when_true, when_false)


def _two_n_plus_one(f: _Fp32, degree: Tile) -> Tile:
    return f.add(f.add(degree, degree), 1.0)


def _chebyshev(kind: str, shifted: bool):
    """Chebyshev polynomials of the first to fourth kinds (T, U, V, W), plain on [-1, 1] or
    shifted to [0, 1] (in ``u = 2x - 1``), as the CPU computes them: the recurrence, a closed
    trigonometric form for high degrees inside the interval, exact values at its ends."""
    trig_from = {"t": 6, "u": 6, "v": 6, "w": 4}[kind] if shifted else {"t": 6, "u": 8, "v": 8, "w": 8}[kind]

    def compute(f: _Fp32, x: Tile, degree: Tile, highest: int) -> Tile:
        u = f.sub(f.add(x, x), 1.0) if shifted else x
        two_u = f.add(u, u)
        first = {"t": u, "u": two_u, "v": f.sub(two_u, 1.0), "w": f.add(two_u, 1.0)}[kind]
        result = _recurrence(f, degree, highest, first, _three_term(f, two_u))
        even = _even(f, degree)
        two_n1 = _two_n_plus_one(f, degree)
        n1 = f.add(degree, 1.0)
        # the closed form for high degrees with |u| < 1
        a = f.act("acos", u)
        if kind == "t":
            closed = f.act("cos", f.mul(degree, a))
        elif kind == "u":
            s = f.act("sin", a)
            ordinary = f.div(f.act("sin", f.mul(n1, a)), s)
            degenerate = f.div(f.mul(n1, f.act("cos", f.mul(n1, a))), u)
            closed = f.where(f.test(s, "not_equal", 0.0), ordinary, degenerate)
        else:
            half = f.div(a, 2.0)
            angle = f.mul(f.add(degree, 0.5), a)
            if kind == "v":
                ordinary = f.div(f.act("cos", angle), f.act("cos", half))
                degenerate = f.where(even, two_n1, f.mul(two_n1, -1.0))
                regular = f.test(f.act("sin", half), "not_equal", 1.0)
            else:
                ordinary = f.div(f.act("sin", angle), f.act("sin", half))
                if shifted:
                    degenerate = f.where(even, 1.0, -1.0)
                else:
                    degenerate = f.where(f.test(x, "greater", 0.0), two_n1, f.where(even, 1.0, -1.0))
                regular = f.test(f.act("cos", half), "not_equal", 1.0)
            closed = f.where(regular, ordinary, degenerate)
        high = f.both(f.test(degree, "greater", float(trig_from)), f.test(f.act("abs", u), "less", 1.0))
        f.where(high, closed, result, into=result)
        # the interval's ends: x = +-1 (plain) or x = 1 and x = 0 (shifted)
        minus_n1 = f.mul(n1, -1.0)
        minus_2n1 = f.mul(two_n1, -1.0)
        if shifted:
            at_one = {"t": 1.0, "u": n1, "v": 1.0, "w": two_n1}[kind]
            at_zero = {"t": f.where(even, 1.0, -1.0), "u": f.where(even, n1, minus_n1),
                       "v": f.where(even, two_n1, minus_2n1), "w": f.where(even, 1.0, -1.0)}[kind]
            f.where(f.test(x, "equal", 0.0), at_zero, result, into=result)
            f.where(f.test(x, "equal", 1.0), at_one, result, into=result)
        else:
            positive = f.test(x, "greater", 0.0)
            at_end = {"t": _odd_even_value(f, positive, even, 1.0, -1.0),
                      "u": _odd_even_value(f, positive, even, n1, minus_n1),
                      "v": f.where(positive, 1.0, f.where(even, two_n1, minus_2n1)),
                      "w": f.where(positive, two_n1, f.where(even, 1.0, -1.0))}[kind]
            f.where(f.test(f.act("abs", x), "equal", 1.0), at_end, result, into=result)
        return result

    return compute


def _hermite(physicists: bool):
    """H_n (``physicists``) or He_n: ``r = 2x q - 2(d-1) p`` or ``r = x q - (d-1) p``; NaN above
    degree 128, as the CPU's float kernel gives."""

    def compute(f: _Fp32, x: Tile, degree: Tile, highest: int) -> Tile:
        factor = f.add(x, x) if physicists else x

        def step(p: Tile, q: Tile, d: int, into: Tile, scratch: Tile) -> None:
            f.mul(factor, q, into=into)
            f.mul(p, float(2 * (d - 1) if physicists else d - 1), into=scratch)
            f.sub(into, scratch, into=into)

        result = _recurrence(f, degree, min(highest, _HERMITE_LIMIT), factor, step)
        return f.where(f.test(degree, "greater", float(_HERMITE_LIMIT)), float("nan"), result, into=result)

    return compute


def _laguerre(f: _Fp32, x: Tile, degree: Tile, highest: int) -> Tile:
    """L_n: ``r = ((2k + (1 - x)) q - k p) / (k + 1)`` with k = d - 1; 1 at x = 0."""
    one_minus_x = f.sub(1.0, x)

    def step(p: Tile, q: Tile, d: int, into: Tile, scratch: Tile) -> None:
        k = d - 1
        f.add(one_minus_x, float(k + k), into=into)
        f.mul(into, q, into=into)
        f.mul(p, float(k), into=scratch)
        f.sub(into, scratch, into=into)
        f.div(into, float(k + 1), into=into)

    result = _recurrence(f, degree, highest, one_minus_x, step)
    return f.where(f.test(x, "equal", 0.0), 1.0, result, into=result)


def _legendre(f: _Fp32, x: Tile, degree: Tile, highest: int) -> Tile:
    """P_n: ``r = ((2k + 1) x q - k p) / (k + 1)`` with k = d - 1; +-1 at x = +-1."""

    def step(p: Tile, q: Tile, d: int, into: Tile, scratch: Tile) -> None:
        k = d - 1
        f.mul(x, float(k + k + 1), into=into)
        f.mul(into, q, into=into)
        f.mul(p, float(k), into=scratch)
        f.sub(into, scratch, into=into)
        f.div(into, float(k + 1), into=into)

    result = _recurrence(f, degree, highest, x, step)
    end = _odd_even_value(f, f.test(x, "greater", 0.0), _even(f, degree), 1.0, -1.0)
    return f.where(f.test(f.act("abs", x), "equal", 1.0), end, result, into=result)


def _highest_degree(n: Any, name: str, cap: int | None) -> int:
    """The largest degree any element asks for, as the host reads it before building the
    program (at least 1); declined above :data:`MAX_DEGREE` unless the function caps it."""
    values = np.asarray(n, dtype=np.float64).reshape(-1)
    values = np.trunc(values[np.isfinite(values)])
    highest = int(max(1.0, values.max())) if values.size else 1
    if cap is not None:
        return min(highest, cap + 1)
    if highest > MAX_DEGREE:
        raise KernelDeclined(f"neuron {name}: degree {highest} is above the {MAX_DEGREE} the program unrolls")
    return highest


def _register_polynomial(op_name: str, compute: Callable[[_Fp32, Tile, Tile, int], Tile],
                         cap: int | None = None) -> None:
    packet = getattr(aten, op_name)

    def body(k: Kernel, out: list[OutSpec], x: Any, n: Any) -> np.ndarray:
        """``x`` or ``n`` may be a number (the ``x_scalar``/``n_scalar`` forms): it then rides
        along as a one-element operand of the result's type (a wrapped number's rule)."""
        _require(out[0], op_name)
        highest = _highest_degree(n, op_name, cap)
        integral = np.asarray(n).dtype.kind in "iub"
        arrays = [v if isinstance(v, np.ndarray) else np.asarray(v, dtype=_F32) for v in (x, n)]

        def chunk(f: _Fp32, srcs: list[Tile]) -> Tile:
            x_tile, n_tile = srcs
            degree = _degrees(f, n_tile, integral)
            result = compute(f, f.fp32(x_tile), degree, highest)
            return f.where(f.test(degree, "less", 0.0), 0.0, result, into=result)

        return _elementwise(k, out[0], arrays, chunk)

    body.__name__ = op_name
    tile_kernel(packet.default, packet.x_scalar, packet.n_scalar)(body)


for _kind in "tuvw":
    _register_polynomial(f"special_chebyshev_polynomial_{_kind}", _chebyshev(_kind, shifted=False))
    _register_polynomial(f"special_shifted_chebyshev_polynomial_{_kind}", _chebyshev(_kind, shifted=True))
_register_polynomial("special_hermite_polynomial_h", _hermite(physicists=True), cap=_HERMITE_LIMIT)
_register_polynomial("special_hermite_polynomial_he", _hermite(physicists=False), cap=_HERMITE_LIMIT)
_register_polynomial("special_laguerre_polynomial_l", _laguerre)
_register_polynomial("special_legendre_polynomial_p", _legendre)


# ---------------------------------------------------------------------------------------------
# Hurwitz zeta: Euler–Maclaurin summation (the CPU's algorithm), in float32
# ---------------------------------------------------------------------------------------------

#: The CPU sums its terms directly until the next one is past 9 and at least nine were taken.
_ZETA_SHIFT = 9
#: ``A[k]``: the Euler–Maclaurin coefficients ``(2k + 2)! / B_{2k+2}`` of the CPU's tail.
_ZETA_A = (12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9, 7.47242496e10,
           -2.950130727918164224e12, 1.1646782814350067249e14, -4.5979787224074726105e15,
           1.8152105401943546773e17, -7.1661652561756670113e18)
#: The most terms summed directly; a negative ``q`` further from 0 would need more (one per unit
#: of ``-q``), and the program declines it to the CPU.
MAX_ZETA_TERMS = 256


def _zeta_terms(q: Any) -> tuple[int, int]:
    """``(terms, negatives)``: how many terms ``(q + j)^-x``, j = 0 .. terms - 1, precede the
    tail at ``w = q + terms``, and how many of them have a negative base at most. ``terms`` is
    the CPU's count for the smallest ``q`` that is summed at all (a non-positive integer ``q``
    is a pole and a non-finite one has no sum), the same for every element."""
    values = np.asarray(q, dtype=np.float64).reshape(-1)
    summed = values[np.isfinite(values) & ((values > 0) | (values != np.floor(values)))]
    lowest = float(summed.min()) if summed.size else 1.0
    terms = max(_ZETA_SHIFT, int(np.floor(_ZETA_SHIFT - lowest)) + 1)
    if terms > MAX_ZETA_TERMS:
        raise KernelDeclined(f"neuron special_zeta: q = {lowest} needs {terms} direct terms, above the "
                             f"{MAX_ZETA_TERMS} the program unrolls")
    return terms, max(0, -int(np.floor(lowest)))


def _two_sum(f: _Fp32, a: Any, b: Any) -> tuple[Tile, Tile]:
    """``a + b`` and its rounding error, exactly (Knuth's TwoSum: no branch on which is larger)."""
    total = f.add(a, b)
    b_part = f.sub(total, a)
    error = f.add(f.sub(a, f.sub(total, b_part)), f.sub(b, b_part))
    return total, error


def _shifted_power(f: _Fp32, q: Tile, shift: Any, power: Tile, power_finite: Tile) -> Tile:
    """``(q + shift)^p`` for the exact ``q + shift`` = ``hi + lo``: ``hi^p (1 + p lo / hi)``.
    Rounding ``q + shift`` to float32 alone would cost ``|p| / 2`` ulps of the power. The
    correction takes ``p`` clamped to a finite value (``power_finite``): an infinite power of
    ``hi`` is 0, 1 or inf already, and ``0 * inf`` would make it NaN."""
    hi, lo = _two_sum(f, q, shift)
    correction = f.add(f.mul(f.div(lo, hi, into=lo), power_finite, into=lo), 1.0, into=lo)
    return f.mul(f.op(hi, "pow", power), correction)


def _zeta(f: _Fp32, x: Tile, q: Tile, terms: int, negatives: int) -> Tile:
    """``sum_j (q + j)^-x``: ``terms`` terms directly, the rest as the Euler–Maclaurin tail at
    ``w = q + terms``: ``w^-x (w / (x - 1) + 1/2) + sum_k t_k``, ``t_k = w^-x x (x + 1) ...
    (x + 2k) / (w^(2k+1) A[k])``. The CPU sums in double precision; here float32 keeps to a few
    ulps of the exact value by three means:

    * smallest first: the tail's series by Horner's rule from its last term (each term is the
      one before times ``(x + 2k - 1)(x + 2k) A[k-1] / (w^2 A[k])``, so nothing overflows where
      ``w^-x`` underflows), then the direct terms from the last;
    * each power of the exactly shifted ``q + j`` (:func:`_shifted_power`), by the Vector
      engine's ``pow``;
    * a negative ``q``'s terms of negative base ``q + m - 1 - i`` (m = -floor(q)) each added
      to that of ``q + m + i`` first: for an odd x the two nearly cancel (exactly, for a
      half-integer q), and what is left can be far below them. The CPU adds them in turn, and
      in double precision keeps their last bits: zeta(19, -2.5) is zeta(19, 3.5) = 4.6e-11,
      the CPU's 9.2e-11.

    (Carrying the direct sum's rounding errors too, TwoSum per term, was measured: no better
    than 1.4 ulps at worst, and a fifth more device time.)

    Where the tail's first term ``w^-x`` is 0 and the direct sum is not, the CPU has stopped
    before the tail (its next term was negligible): the tail is left out, as an infinite ``x``
    would otherwise make it NaN; where both are 0, the tail is kept, NaN or 0 as the CPU's.
    Then the CPU's domain: x = 1 is a pole (inf), x < 1 NaN, a non-positive integer ``q`` a
    pole (inf), a negative non-integer ``q`` NaN unless ``x`` is an integer."""
    minus_x = f.mul(x, -1.0)
    minus_x_finite = f.op(minus_x, "maximum", -float(np.finfo(_F32).max))
    one_minus_x = f.add(minus_x, 1.0)
    w = f.add(q, float(terms))
    # w^(1-x) and not w^-x w: for a large q, w^-x underflows long before w^(1-x) / (x - 1) does
    b_w = _shifted_power(f, q, float(terms), one_minus_x, f.add(minus_x_finite, 1.0))
    b = f.div(b_w, w)
    inverse_w2 = f.div(1.0, f.mul(w, w))
    series = f.new("series")
    f.k.memset(series, 1.0)
    factor = f.new("factor")
    for k in range(len(_ZETA_A) - 1, 0, -1):
        f.mul(f.add(x, float(2 * k - 1)), f.add(x, float(2 * k)), into=factor)
        f.mul(factor, inverse_w2, into=factor)
        f.mul(factor, _ZETA_A[k - 1] / _ZETA_A[k], into=factor)
        f.add(f.mul(series, factor, into=series), 1.0, into=series)
    tail = f.mul(f.div(f.mul(b, x), f.mul(w, _ZETA_A[0])), series)
    f.add(tail, f.mul(b, 0.5), into=tail)
    f.add(tail, f.div(b_w, f.sub(x, 1.0)), into=tail)
    # a negative q's first m direct terms have negative bases: q + m + i pairs with q + m - 1 - i
    # (for a half-integer q and an odd x the two cancel exactly, so they are added first)
    m = f.where(f.test(q, "less", 0.0), f.mul(f.act("floor", q), -1.0), 0.0)
    shift = f.new("shift")
    direct = f.new("direct")
    f.k.memset(direct, 0.0)
    for i in range(terms - 1, -1, -1):
        with f.k.scope():
            f.add(m, float(i), into=shift)
            power = _shifted_power(f, q, shift, minus_x, minus_x_finite)
            term = f.where(f.test(shift, "less", float(terms)), power, 0.0)
            if i < negatives:
                f.add(m, float(-1 - i), into=shift)
                mirror = _shifted_power(f, q, shift, minus_x, minus_x_finite)
                f.add(term, f.where(f.test(m, "greater", float(i)), mirror, 0.0), into=term)
            f.add(direct, term, into=direct)
    stopped = f.both(f.test(b, "equal", 0.0), f.test(direct, "not_equal", 0.0))
    result = f.where(stopped, direct, f.add(direct, tail))
    # the domain, lowest precedence first
    fractional_x = f.test(f.act("floor", x), "not_equal", x)
    f.where(f.both(f.test(q, "less", 0.0), fractional_x), float("nan"), result, into=result)
    pole_q = f.both(f.test(q, "less_equal", 0.0), f.test(f.act("floor", q), "equal", q))
    f.where(pole_q, float("inf"), result, into=result)
    f.where(f.test(x, "less", 1.0), float("nan"), result, into=result)
    return f.where(f.test(x, "equal", 1.0), float("inf"), result, into=result)


def _special_zeta(k: Kernel, out: list[OutSpec], x: Any, q: Any) -> np.ndarray:
    """``x`` or ``q`` may be a number (the ``self_scalar``/``other_scalar`` forms): it rides
    along as a one-element operand. The CPU computes float32 and float64 only."""
    _require(out[0], "special_zeta")
    terms, negatives = _zeta_terms(q)
    arrays = [v if isinstance(v, np.ndarray) else np.asarray(v, dtype=_F32) for v in (x, q)]
    return _elementwise(k, out[0], arrays,
                        lambda f, srcs: _zeta(f, f.fp32(srcs[0]), f.fp32(srcs[1]), terms, negatives))


tile_kernel(aten.special_zeta.default, aten.special_zeta.self_scalar, aten.special_zeta.other_scalar)(_special_zeta)
