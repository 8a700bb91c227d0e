"""`metered`: each backend operation's wall seconds land in its agent's usage, once."""

from __future__ import annotations

import pytest

from sieverag.inference.llm import backend_protocol
from sieverag.inference.llm.backend_protocol import Usage, UsageMeter, metered


class Clock:
    """A perf_counter that advances by the seconds each operation says it took."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Backend:
    def __init__(self, clock: Clock) -> None:
        self.meter = UsageMeter()
        self.clock = clock

    @metered
    def generate(self, prompts, settings=None, *, agent: str = "generator") -> list[str]:
        self.clock.now += 2.0
        self.meter.record(agent, len(prompts), 10, 1)
        return ["x"] * len(prompts)

    @metered
    def label_logprobs(self, prompts, labels, *, agent: str = "scorer") -> list[dict]:
        self.clock.now += 0.5
        self.meter.record(agent, len(prompts), 10, 0)
        # a multi-token label scored as a reply, inside this operation
        self.continuation_logprob(prompts, ["No way"] * len(prompts), agent=agent)
        return [{label: -1.0 for label in labels} for _ in prompts]

    @metered
    def continuation_logprob(self, prompts, continuations, *, agent: str = "scorer"):
        self.clock.now += 0.25
        return [-1.0] * len(prompts)

    @metered
    def broken(self, prompts, *, agent: str = "generator"):
        self.clock.now += 1.0
        self.meter.record(agent, len(prompts), 5, 0)
        raise RuntimeError("the model fell over")


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> Backend:
    clock = Clock()
    monkeypatch.setattr(backend_protocol.time, "perf_counter", clock)
    return Backend(clock)


def test_an_operation_adds_its_seconds_to_the_agent_it_names(backend: Backend) -> None:
    backend.generate(["a", "b"], agent="reviewer")
    backend.generate(["c"])  # the signature's default agent
    usage = backend.meter.snapshot()
    assert usage["reviewer"].seconds == 2.0 and usage["generator"].seconds == 2.0
    assert usage["reviewer"].calls == 2


def test_an_operation_inside_another_is_counted_once(backend: Backend) -> None:
    backend.label_logprobs(["a"], ["Yes", "No way"], agent="judge")
    assert backend.meter.snapshot()["judge"].seconds == 0.75  # not 0.75 + 0.25
    backend.continuation_logprob(["a"], ["b"], agent="judge")  # alone it counts again
    assert backend.meter.snapshot()["judge"].seconds == 1.0


def test_a_failed_operation_adds_no_seconds_and_the_next_one_is_timed(backend: Backend) -> None:
    with pytest.raises(RuntimeError, match="fell over"):
        backend.broken(["a"], agent="challenger")
    assert backend.meter.snapshot()["challenger"].seconds == 0.0
    backend.generate(["b"], agent="challenger")
    assert backend.meter.snapshot()["challenger"].seconds == 2.0


def test_seconds_travel_with_snapshots_and_differences(backend: Backend) -> None:
    backend.generate(["a"])
    before = backend.meter.snapshot()
    backend.generate(["b"])
    assert backend.meter.since(before)["generator"] == Usage(1, 10, 1, 0, 0, 2.0)
    total = Usage()
    total.add(backend.meter.snapshot()["generator"])
    assert total.seconds == 4.0
