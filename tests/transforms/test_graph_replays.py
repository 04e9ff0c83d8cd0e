"""GraphReplays' bookkeeping on the cpu, with a stand-in for a CUDA graph that behaves like one: it reads the
tensors it was captured on and writes into the outputs it was captured with, whatever the caller holds; and, on a GPU,
what a failed capture leaves behind."""

from collections.abc import Callable, Sequence

import pytest
import torch

from tests.gpu import needs_gpu
from transforms.graph_replays import CAPTURE_TRIES, GraphReplays, cuda_capture


def forward(values: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [values[0] * 2 + values[1]]


class StandIn:
    def __init__(self, failures: int = 0) -> None:
        self.captures, self.failures = 0, failures  # the first ``failures`` captures raise, as a spoiled capture does

    def __call__(self, run: Callable[[Sequence[torch.Tensor]], list[torch.Tensor]], inputs: Sequence[torch.Tensor],
                 pool: object) -> tuple[Callable[[], None], list[torch.Tensor]]:
        self.captures += 1
        if self.captures <= self.failures:
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture")
        outputs = [torch.full_like(t, float("nan")) for t in run(inputs)]  # a graph's buffers hold nothing yet

        def replay() -> None:
            for out, new in zip(outputs, run(inputs), strict=True):
                out.copy_(new)

        return replay, outputs


def replays(limit: int = 4, failures: int = 0) -> tuple[GraphReplays, StandIn]:
    capture = StandIn(failures)
    return GraphReplays(forward, torch.device("cpu"), warm_up=lambda _: None, capture=capture, limit=limit,
                        pool=lambda: None), capture


def expected(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x.double() * 2 + y.double()).float()


def test_inputs_at_the_same_addresses_replay_one_graph_on_their_new_values() -> None:
    graphs, capture = replays()
    x, y = torch.randn(3, 3), torch.randn(3, 3)
    for _ in range(3):
        x.add_(1.0)  # the caller refills its buffer: the graph reads it where it lies
        torch.testing.assert_close(graphs([x, y])[0], expected(x, y))
    assert capture.captures == 1 and graphs.copying is None


def test_an_output_the_caller_holds_is_never_overwritten() -> None:
    graphs, capture = replays()
    x, y = torch.randn(3, 3), torch.randn(3, 3)
    kept = graphs([x, y])[0]
    first = expected(x, y)
    x.mul_(-3.0)
    again = graphs([x, y])[0]  # the caller holds `kept`: this call copies instead of replaying
    second = expected(x, y)
    torch.testing.assert_close(kept, first)
    torch.testing.assert_close(again, second)
    view = kept[1:]  # a view holds the storage as well
    del kept, again
    x.add_(5.0)
    third = graphs([x, y])[0]
    torch.testing.assert_close(view, first[1:])
    torch.testing.assert_close(third, expected(x, y))
    assert capture.captures == 2  # one graph on the caller's tensors, one copying way


def test_an_output_let_go_lets_its_graph_replay_again() -> None:
    graphs, capture = replays()
    x, y = torch.randn(3, 3), torch.randn(3, 3)
    out = graphs([x, y])[0]
    out.mul_(0.0)  # the caller may even write into it
    del out
    x.add_(2.0)
    torch.testing.assert_close(graphs([x, y])[0], expected(x, y))
    assert capture.captures == 1 and graphs.copying is None


def test_the_same_address_with_other_strides_is_another_graph() -> None:
    graphs, capture = replays()
    x, y = torch.randn(3, 3), torch.randn(3, 3)
    torch.testing.assert_close(graphs([x, y])[0], expected(x, y))
    torch.testing.assert_close(graphs([x.t(), y])[0], expected(x.t(), y))
    assert capture.captures == 2


@pytest.mark.parametrize("limit", [0, 2])
def test_past_the_limit_calls_copy_and_stay_right(limit: int) -> None:
    graphs, capture = replays(limit=limit)
    sets = [(torch.randn(4, 2), torch.randn(4, 2)) for _ in range(4)]
    for _ in range(2):
        for x, y in sets:
            torch.testing.assert_close(graphs([x, y])[0], expected(x, y))
    assert len(graphs.by_address) == limit and capture.captures == limit + 1


def test_a_capture_spoiled_twice_is_tried_again_and_replays() -> None:
    graphs, capture = replays(failures=CAPTURE_TRIES - 1)
    x, y = torch.randn(4, 2), torch.randn(4, 2)
    torch.testing.assert_close(graphs([x, y])[0], expected(x, y))
    x.copy_(torch.randn(4, 2))
    torch.testing.assert_close(graphs([x, y])[0], expected(x, y))  # the graph replays on the new values
    assert capture.captures == CAPTURE_TRIES and len(graphs.by_address) == 1


def test_a_capture_that_always_fails_raises_after_its_tries() -> None:
    graphs, capture = replays(failures=CAPTURE_TRIES)
    with pytest.raises(RuntimeError, match="during capture"):
        graphs([torch.randn(4, 2), torch.randn(4, 2)])
    assert capture.captures == CAPTURE_TRIES


def spoiled(values: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """A forward that draws random numbers, then synchronizes, which a capture forbids: its capture fails."""
    noise = torch.rand(values[0].shape, device=values[0].device)
    torch.cuda.synchronize()
    return [values[0] + noise]


@needs_gpu
def test_after_a_failed_capture_random_draws_streams_and_captures_work() -> None:
    caller = torch.cuda.current_stream()
    x = torch.full((1024,), 2.0, device="cuda")
    with pytest.raises(RuntimeError):
        cuda_capture(spoiled, [x], torch.cuda.graph_pool_handle())
    assert torch.cuda.current_stream() == caller  # not the failed capture's stream
    draws = torch.rand(1 << 16, device="cuda")  # raised "Offset increment outside graph capture" before
    assert draws.min().item() >= 0.0 and draws.max().item() < 1.0 and draws.std().item() > 0.25
    replay, (out,) = cuda_capture(forward, [x, x], torch.cuda.graph_pool_handle())
    x.fill_(3.0)
    replay()
    assert torch.equal(out, torch.full_like(x, 9.0))  # 3 * 2 + 3, computed by the graph on the new values
