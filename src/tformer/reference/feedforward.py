"""NumPy mirror of tformer.nn.feedforward (Vaswani et al. 2017, §3.3): down(act(up(x)))."""

from __future__ import annotations

import math

import numpy as np

from tformer.config import check_positive
from tformer.reference.module import Linear, Module

# NumPy has no erf. These are the rational approximations of Hart et al., "Computer
# Approximations" (1968), as used by 4.3BSD libm: erf(x) = x P(x^2)/Q(x^2) for |x| < 0.5,
# erfc(x) = exp(-x^2) P(x)/Q(x) above. Max abs error vs math.erf: 3.3e-16 on [-12, 12]
# (tests/reference/test_feedforward.py). Coefficients are listed lowest power first.
_ERF_P = (8.04373630960840172832162e4, 7.40407142710151470082064e3, 3.01782788536507577809226e3,
          3.80140318123903008244444e1, 1.43383842191748205576712e1, -2.88805137207594084924010e-1,
          7.547728033418631287834e-3)
_ERF_Q = (8.04373630960840172826266e4, 3.42165257924628539769006e4, 6.37960017324428279487120e3,
          6.58070155459240506326937e2, 3.80190713951939403753468e1, 1.0)
_ERFC_P = (1.8263348842295112592168999e3, 2.8980293292167655611275846e3,
           2.320439590251635247384768711e3, 1.143262070703886173606073338e3,
           3.685196154710010637133875746e2, 7.708161730368428609781633646e1,
           9.675807882987265400604202961, 5.641877825507397413087057563e-1)
_ERFC_Q = (1.8263348842295112595576438e3, 4.95882756472114071495438422e3,
           6.0895424232724435504633068e3, 4.429612803883682726711528526e3,
           2.094384367789539593790281779e3, 6.617361207107653469211984771e2,
           1.371255960500622202878443578e2, 1.714980943627607849376131193e1, 1.0)


def _polynomial(coefficients: tuple[float, ...], x: np.ndarray) -> np.ndarray:
    """Horner's rule, in place after the first step; Python-float coefficients keep x's dtype."""
    y = coefficients[-1] * x
    y += coefficients[-2]
    for c in coefficients[-3::-1]:
        y *= x
        y += c
    return y


# float32 needs 7 significant digits, not 16: the rational function Eigen and XLA use for float
# erf, x P(x^2) / Q(x^2) on [-4, 4] (beyond, erf is +-1 in float32), max abs error 4.5e-7 (a few
# float32 steps near +-1; measured against math.erf on 2M points of [-4.5, 4.5]): one
# polynomial pair over every element instead of two, ~4x cheaper than the double version.
_ERF32_P = (-1.60960333262415e-02, -2.95459980854025e-03, -7.34990630326855e-04,
            -5.69250639462346e-05, -2.10102402082508e-06, 2.77068142495902e-08,
            -2.72614225801306e-10)
_ERF32_Q = (-1.42647390514189e-02, -7.37332916720468e-03, -1.68282697438203e-03,
            -2.13374055278905e-04, -1.45660718464996e-05)


def _erf_float32(x: np.ndarray) -> np.ndarray:
    x = np.clip(x, -4.0, 4.0)
    x2 = x * x
    p = _polynomial(_ERF32_P, x2)
    p *= x
    p /= _polynomial(_ERF32_Q, x2)
    return p


def erf(x: np.ndarray) -> np.ndarray:
    if x.dtype == np.float32:  # float32 needs 7 digits: a cheaper rational function suffices
        return _erf_float32(x)
    a = np.abs(x)
    a2 = a * a
    near = (2.0 / math.sqrt(math.pi)) * a * _polynomial(_ERF_P, a2) / _polynomial(_ERF_Q, a2)
    capped = np.minimum(a, 10.0)  # erfc(10) < 1e-43: erf is 1 to double precision
    far = 1.0 - np.exp(-capped * capped) * _polynomial(_ERFC_P, capped) / _polynomial(_ERFC_Q, capped)
    return np.sign(x) * np.where(a < 0.5, near, far)


def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0)


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact GELU: x * Phi(x) = x/2 (1 + erf(x / sqrt 2)) (Hendrycks & Gimpel 2016)."""
    y = erf(x * (1.0 / math.sqrt(2.0)))
    y += 1.0  # in place: the (B, S, F) activation is the largest array of the layer
    y *= x
    y *= 0.5
    return y


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """The tanh approximation of GELU, as torch's gelu(approximate="tanh")."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


ACTIVATIONS = {"relu": relu, "gelu": gelu, "gelu_tanh": gelu_tanh}


# Derivatives, for the backward pass: act'(x), elementwise.
def relu_grad(x: np.ndarray) -> np.ndarray:
    return (x > 0).astype(x.dtype)  # 0 at x = 0, as torch


def gelu_grad(x: np.ndarray) -> np.ndarray:
    """d/dx [x Phi(x)] = Phi(x) + x phi(x), with phi(x) = exp(-x^2/2) / sqrt(2 pi)."""
    cdf = 0.5 * (1.0 + erf(x * (1.0 / math.sqrt(2.0))))
    pdf = np.exp(-0.5 * x * x) * (1.0 / math.sqrt(2.0 * math.pi))
    return cdf + x * pdf


def gelu_tanh_grad(x: np.ndarray) -> np.ndarray:
    """With u = c (x + a x^3), c = sqrt(2/pi), a = 0.044715, y = x/2 (1 + tanh u):
    dy/dx = (1 + tanh u)/2 + x/2 (1 - tanh^2 u) c (1 + 3 a x^2)."""
    c = math.sqrt(2.0 / math.pi)
    t = np.tanh(c * (x + 0.044715 * x * x * x))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * x * x)


ACTIVATION_GRADS = {"relu": relu_grad, "gelu": gelu_grad, "gelu_tanh": gelu_tanh_grad}


class FeedForward(Module):
    """Shape: x (B, S, D) -> (B, S, D), through (B, S, F) inside."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", bias: bool = True):
        check_positive("d_model", d_model)
        check_positive("d_ff", d_ff)
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"activation: expected one of {', '.join(ACTIVATIONS)}; got {activation!r}"
            )
        self.activation = activation
        self.up = Linear(d_model, d_ff, bias=bias)
        self.down = Linear(d_ff, d_model, bias=bias)

    def forward(self, x: np.ndarray) -> np.ndarray:
        return self.down(ACTIVATIONS[self.activation](self.up(x)))  # (B, S, F) -> (B, S, D)

    def forward_train(self, x: np.ndarray, rng=None) -> tuple[np.ndarray, tuple]:
        pre = self.up(x)  # (B, S, F)
        hidden = ACTIVATIONS[self.activation](pre)  # (B, S, F)
        return self.down(hidden), (x, pre, hidden)

    def backward(self, dy: np.ndarray, cache: tuple, grads: dict, prefix: str = "") -> np.ndarray:
        """Shape: dy (B, S, D) -> dx (B, S, D); the activation's derivative acts elementwise."""
        x, pre, hidden = cache
        dhidden = self.down.backward(dy, hidden, grads, prefix + "down.")  # (B, S, F)
        dpre = dhidden * ACTIVATION_GRADS[self.activation](pre)  # (B, S, F)
        return self.up.backward(dpre, x, grads, prefix + "up.")  # (B, S, D)
