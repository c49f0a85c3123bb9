from gemmtune.measure.timing import IDLE_AFTER_S, IDLE_WARMUP_MS, IdleWarmup, warmup_ms_after


def test_a_candidate_after_a_pause_warms_up_longer():
    assert warmup_ms_after(2.0, 25.0) == IDLE_WARMUP_MS > 25.0
    assert warmup_ms_after(float("inf"), 25.0) == IDLE_WARMUP_MS  # the worker's first timing


def test_back_to_back_candidates_keep_the_requested_warmup():
    assert warmup_ms_after(IDLE_AFTER_S / 10, 25.0) == 25.0
    assert warmup_ms_after(5.0, 400.0) == 400.0  # never shortened


def test_idle_warmup_follows_the_last_timing(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("gemmtune.measure.timing.time.perf_counter", lambda: now[0])
    idle = IdleWarmup()
    assert idle.warmup_ms(25.0) == IDLE_WARMUP_MS  # nothing timed yet: the GPU is cold
    idle.timed()
    now[0] += IDLE_AFTER_S / 2
    assert idle.warmup_ms(25.0) == 25.0
    now[0] += 1.0  # a kernel compiling
    assert idle.warmup_ms(25.0) == IDLE_WARMUP_MS
