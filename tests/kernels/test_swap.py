"""`swap_ab` configs: the kernel computes out^T = b^T @ a^T. Their binaries are built for the
transposed layouts, their launches hand the kernel the transposed views, and everything that
sizes a launch (tile grid, workspace, ranking) works in the transposed problem's terms."""

import dataclasses

import pytest
import torch

from gemmtune.core.config import GemmConfig
from gemmtune.core.device import Arch
from gemmtune.core.problem import GemmProblem, Operand
from gemmtune.kernels.build import CompiledGemm
from gemmtune.kernels.launch import workspace_need
from gemmtune.kernels.schedule_model import TileGrid
from gemmtune.kernels.signature import KernelSignature
from gemmtune.kernels.sm90 import rules as sm90
from gemmtune.space import binaries
from gemmtune.space.ranking import RankingModel

SWAPPED = GemmConfig(tile_m=256, tile_n=208, cluster_n=2, swap_ab=True)


def operand(rows, cols, column_major):
    stride = (1, rows) if column_major else (cols, 1)
    return Operand((rows, cols), stride, torch.bfloat16, torch.device("cuda", 0), 1 << 20)


def problem(m, n, k, a_col=False, b_col=False, out_col=False):
    """The problem of a (m, k) @ b (k, n) into out (m, n), each row- or column-major."""
    return GemmProblem.from_operands(
        operand(m, k, a_col), operand(k, n, b_col), operand(m, n, out_col), arch=Arch.SM90
    )


@pytest.mark.parametrize("a_col", [False, True])
@pytest.mark.parametrize("b_col", [False, True])
@pytest.mark.parametrize("out_col", [False, True])
def test_swapped_signature_is_that_of_the_transposed_tensors(a_col, b_col, out_col):
    direct = problem(300, 500, 700, a_col, b_col, out_col)
    # b^T is (n, k), column-major exactly when b is row-major; likewise a^T and out^T
    transposed = problem(500, 300, 700, not b_col, not a_col, not out_col)
    assert KernelSignature.of(direct).swapped() == KernelSignature.of(transposed)
    assert KernelSignature.of(direct).swapped().swapped() == KernelSignature.of(direct)


def test_an_unaligned_output_keeps_its_signature_apart_and_swapped():
    # 2,100 bf16 values are 4,200 bytes: the output's rows are not 16-byte aligned
    sig = KernelSignature.of(problem(300, 2100, 704, False, True, False))
    assert not sig.out_aligned and sig.key == "bf16_bf16_ak_bk_on_2d_unaligned"
    assert not sig.swapped().out_aligned
    assert KernelSignature.of(problem(300, 2104, 704, False, True, False)).out_aligned


def test_row_major_product_swaps_to_m_major_a_k_major_b_and_a_column_major_output():
    swapped = KernelSignature().swapped()
    assert (swapped.a_major, swapped.b_major, swapped.out_major) == ("m", "k", "m")


def test_tile_grid_of_a_swapped_config_cuts_the_transposed_output():
    grid = TileGrid.of(SWAPPED, 4096, 28672, 1)
    # 28672 / 256 = 112 tiles down the transposed M, 4096 / 208 -> 20 across its N, in
    # clusters of 1 x 2: 112 x 10 units
    assert (grid.tiles_m, grid.tiles_n, grid.work_units) == (112, 20, 1120)
    unswapped = TileGrid.of(dataclasses.replace(SWAPPED, swap_ab=False), 4096, 28672, 1)
    assert (unswapped.tiles_m, unswapped.tiles_n) == (16, 138)


def test_workspace_is_sized_on_the_transposed_problem():
    config = GemmConfig(tile_m=128, tile_n=64, swap_ab=True, decomposition="split_k", splits=4)
    # 64 x 512: transposed, 512 x 64 is 4 x 1 tiles of 128 x 64 (unswapped: 1 x 8)
    need = workspace_need(config, 64, 512, 8192, 1, 132)
    assert need.counters == 4
    assert need.partials == 4 * 4 * 128 * 64


def test_a_swapped_binary_is_launched_with_the_problems_own_tensors():
    """The kernel reads b, a and out transposed at trace time (`operands.kernel_operands`), so
    a launch makes no transposed views: the compiled function is the launcher."""
    calls = []

    def function(*args):
        calls.append(args)

    a, b, out = torch.zeros(3, 5), torch.zeros(5, 7), torch.zeros(3, 7)
    rest = (None, None, 0, 1, 1, 66)
    kernel = CompiledGemm(SWAPPED, KernelSignature(), function, 0.0)
    assert kernel.launcher is function
    kernel(a, b, out, *rest)
    assert calls[-1][:3] == (a, b, out) and calls[-1][3:] == rest


def test_space_offers_every_binary_swapped_too_unless_it_would_spill():
    p = problem(4096, 4096, 4096)
    configs = binaries(p)
    swapped = {c for c in configs if c.swap_ab}
    twins = {dataclasses.replace(c, swap_ab=True) for c in configs if not c.swap_ab}
    refused = twins - swapped
    assert swapped <= twins and len(refused) == 12
    # the swapped kernel writes an M-major output: thread stores of 192+ accumulators spill
    for c in refused:
        reason = sm90.signature_reason(c, KernelSignature.of(p))
        assert not c.tma_store
        assert sm90.accumulator_registers(c) >= 192 and "spill" in reason
    # 192-row tiles (three warpgroups) store to it by threads too
    assert any(c.tile_m == 192 and not c.tma_store for c in swapped)


def test_ranking_sees_a_swapped_config_as_its_kernel_does():
    """A swapped config on (m, n) is predicted exactly as the unswapped one on (n, m)."""
    model = RankingModel()
    unswapped = dataclasses.replace(SWAPPED, swap_ab=False)
    for m, n, k in ((4096, 28672, 4096), (128, 6144, 4096), (1000, 3000, 500)):
        direct = model.predict_us(problem(m, n, k), SWAPPED)
        transposed = model.predict_us(problem(n, m, k, True, True, True), unswapped)
        assert direct == pytest.approx(transposed)
    # 4096 x 28672: 17 rounds of 208 x 256 output tiles beat 28 of 128 x 256
    gateup = problem(4096, 28672, 4096)
    assert model.predict_us(gateup, SWAPPED) < model.predict_us(
        gateup, GemmConfig(tile_m=128, tile_n=256, cluster_m=2)
    )
