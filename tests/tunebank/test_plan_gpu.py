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
    with torch.no_grad():
        for _ in range(3):  # the first call captures; later ones replay
            x = torch.randn_like(x)
            torch.testing.assert_close(fast(x), module(x), **tolerance)
    assert fast.use_cuda_graph and fast._graph is not None
    again = tunebank.load(tunebank.save(fast, tmp_path / "p.tbplan"), settings=settings)
    with torch.no_grad():
        torch.testing.assert_close(again(x), module(x), **tolerance)
