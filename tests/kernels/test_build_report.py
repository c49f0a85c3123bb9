"""`build.waits_after_every_mma`: the SASS sign of a kernel whose WGMMAs ptxas serialized."""

from gemmtune.kernels.build import MMA_INSTRUCTIONS, waits_after_every_mma

HOPPER_MMA = MMA_INSTRUCTIONS["sm_90"][1]
PAD = " " * 19
MMA = f"        /*3940*/{PAD}QGMMA.64x16x32.F32.E4M3.E4M3 R32, gdesc[UR12], R32 ;"
LAST_MMA = f"        /*3d60*/{PAD}QGMMA.64x16x32.F32.E4M3.E4M3 R32, gdesc[UR12], R32, gsb0 ;"
DRAIN = f"        /*3a20*/{PAD}WARPGROUP.DEPBAR.LE gsb0, 0x0 ;"
KEEP_ONE = f"        /*41d0*/{PAD}WARPGROUP.DEPBAR.LE gsb0, 0x1 ;"
ARRIVE = f"        /*3a30*/{PAD}WARPGROUP.ARRIVE ;"
OTHER = f"        /*3a40*/{PAD}IADD3 R2, R2, 0x1, RZ ;"


def sass(*lines):
    return "\n".join(lines)


def test_batches_of_wgmmas_waited_for_as_batches_are_not_serialized():
    batch = [ARRIVE, MMA, OTHER, MMA, MMA, LAST_MMA]
    listing = sass(*batch, KEEP_ONE, OTHER, *batch, KEEP_ONE, *batch, DRAIN, DRAIN)
    assert not waits_after_every_mma(listing, HOPPER_MMA)


def test_a_drain_after_every_wgmma_is_serialized():
    one = [ARRIVE, MMA, OTHER, DRAIN]
    listing = sass(*(one * 4), *(one * 4))
    assert waits_after_every_mma(listing, HOPPER_MMA)


def test_a_wait_that_keeps_one_batch_in_flight_is_no_drain():
    listing = sass(ARRIVE, MMA, KEEP_ONE, ARRIVE, MMA, KEEP_ONE)
    assert not waits_after_every_mma(listing, HOPPER_MMA)


def test_a_listing_without_wgmmas_is_not_serialized():
    assert not waits_after_every_mma(sass(OTHER, DRAIN), HOPPER_MMA)
