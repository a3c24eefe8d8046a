"""The one backoff rule: the wait asked for, else doubling to a cap, with 50-100 % jitter."""

from __future__ import annotations

from core.agent.retry import RetryPolicy
from core.backoff import backoff
from core.outbox import DeliveryPolicy


def test_the_wait_asked_for_is_kept_and_never_negative() -> None:
    assert backoff(3, 0.5, 8.0, retry_after=40.0) == 40.0
    assert backoff(0, 0.5, 8.0, retry_after=-2.0) == 0.0


def test_backoff_doubles_to_its_cap_with_jitter_that_spreads_it() -> None:
    for attempt, full in ((0, 0.5), (1, 1.0), (3, 4.0), (4, 8.0), (5000, 8.0)):
        waits = {backoff(attempt, 0.5, 8.0) for _ in range(200)}
        assert all(full / 2 <= w <= full for w in waits)
        assert len(waits) > 100  # jittered, not one fixed wait


def test_model_retries_count_from_zero_and_deliveries_from_one() -> None:
    assert 0.25 <= RetryPolicy(base_delay_s=0.5).delay(0, None) <= 0.5
    delivery = DeliveryPolicy(base_delay_s=0.5, max_delay_s=60.0)
    assert 0.25 <= delivery.delay(1, None) <= 0.5  # after the first failed send
    assert 30.0 <= delivery.delay(10_000, None) <= 60.0
