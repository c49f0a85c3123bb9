from gemmtune.bench.runner import IDLE_AFTER_S, IDLE_WARMUP_MS, warmup_ms_after


def test_a_candidate_after_a_pause_warms_up_longer():
    assert warmup_ms_after(2.0, 25.0) == IDLE_WARMUP_MS > 25.0
    assert warmup_ms_after(float("inf"), 25.0) == IDLE_WARMUP_MS  # the worker's first timing


def test_back_to_back_candidates_keep_the_requested_warmup():
    assert warmup_ms_after(IDLE_AFTER_S / 10, 25.0) == 25.0
    assert warmup_ms_after(5.0, 400.0) == 400.0  # never shortened
