"""Plans on the cuda backend (GPU machines only): generated kernels and eager ops on PyTorch's tensors and stream,
captured into one CUDA graph, against eager PyTorch; a saved plan loaded again."""

from pathlib import Path

import pytest
import torch

import tunebank
from tests.gpu import needs_gpu
from tunebank.settings import Settings


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.norm, self.down = torch.nn.Linear(256, 1024), torch.nn.LayerNorm(1024), torch.nn.Linear(1024, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.down(torch.nn.functional.gelu(self.norm(self.up(x)))) + x, dim=-1)


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_cuda_plan_of_generated_kernels_runs_in_one_cuda_graph_and_matches_eager(tmp_path: Path,
                                                                                   dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    module = Block().eval().to("cuda", dtype)
    x = torch.randn(512, 256, device="cuda", dtype=dtype)
    settings = Settings(data_dir=tmp_path)
    # a negative margin keeps every validated kernel and no whole-model timing can drop them, so the graph holds
    # generated code
    fast = tunebank.compile(module, (x,), backend="cuda", k=2, margin=-1.0, settings=settings, time_model=False)
    assert fast.plan.kernels > 0
    tolerance = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-3}
    xs = [torch.randn_like(x) for _ in range(3)]
    with torch.no_grad():
        kept, want = fast(xs[0]), module(xs[0])
        for _ in range(2):  # a graph per input address set: the first call captures, the second replays
            for x in xs:
                torch.testing.assert_close(fast(x), module(x), **tolerance)
        torch.testing.assert_close(kept, want, **tolerance)  # an output held is never overwritten
        xs[1].mul_(-2.0)  # the caller refills a buffer in place: its graph reads it where it lies
        torch.testing.assert_close(fast(xs[1]), module(xs[1]), **tolerance)
    assert fast.use_cuda_graph and fast.graphs is not None
    assert len(fast.graphs.by_address) == 3 and fast.graphs.copying is not None  # `kept` made xs[0]'s calls copy
    again = tunebank.load(tunebank.save(fast, tmp_path / "p.tbplan"), settings=settings)
    with torch.no_grad():
        torch.testing.assert_close(again(x), module(x), **tolerance)
