"""The GEMM families' shape rule (no GPU, no torch): every M, N, K that TMA addresses is
taken, and a size that breaks TMA's 16-byte rule is named with the rule and the bytes."""

from __future__ import annotations

import pytest

from ptxdsl.kernels.wgmma import tma_shape_error


@pytest.mark.parametrize("m, n, k, in_bytes", [
    (1, 8, 8, 2), (3, 24, 40, 2), (1000, 1528, 1000, 2), (4097, 14336, 4104, 2),
    (2**32 - 1, 8, 8, 2), (5, 8, 16, 1), (7, 1032, 4112, 1),
])
def test_every_shape_tma_addresses_is_taken(m, n, k, in_bytes):
    assert tma_shape_error(m, n, k, in_bytes) is None


@pytest.mark.parametrize("m, n, k, in_bytes, words", [
    (8, 8, 60, 2, ["K=60", "16-byte rule", "K x 2 = 120 bytes", "K a multiple of 8"]),
    (8, 8, 1, 2, ["K=1", "16-byte rule", "K x 2 = 2 bytes"]),
    (8, 8, 56, 1, ["K=56", "16-byte rule", "K x 1 = 56 bytes", "K a multiple of 16"]),
    (8, 12, 64, 2, ["N=12", "16-byte rule", "N x 2 = 24 bytes", "N a multiple of 8"]),
    (8, 1001, 64, 1, ["N=1001", "16-byte rule", "N x 2 = 2002 bytes"]),
    (0, 8, 64, 2, ["at least 1", "M=0"]),
    (8, 8, 2**32, 2, ["below 2**32", "K=4294967296"]),
])
def test_a_shape_tma_cannot_address_is_named(m, n, k, in_bytes, words):
    why = tma_shape_error(m, n, k, in_bytes)
    assert why is not None and all(w in why for w in words), why
