"""Two-layer GCN over a CSR adjacency, through the custom op ``tunebank::spmm_csr`` (IR op ``spmm``)."""

import torch
from torch import Tensor, nn

from embed.zoo.family import Built, family


@torch.library.custom_op("tunebank::spmm_csr", mutates_args=())
def spmm_csr(indptr: Tensor, indices: Tensor, values: Tensor, dense: Tensor) -> Tensor:
    """CSR sparse [rows, K] x dense [K, N] -> [rows, N]."""
    rows = indptr.numel() - 1
    row_ids = torch.repeat_interleave(torch.arange(rows, device=dense.device), indptr[1:] - indptr[:-1])
    out = torch.zeros(rows, dense.shape[1], dtype=dense.dtype, device=dense.device)
    return out.index_add_(0, row_ids, values.unsqueeze(1) * dense[indices])


@spmm_csr.register_fake
def _spmm_csr_fake(indptr: Tensor, indices: Tensor, values: Tensor, dense: Tensor) -> Tensor:
    return dense.new_empty((indptr.shape[0] - 1, dense.shape[1]))


class Gcn(nn.Module):
    """relu(A (X W1)) then A (H W2), log-softmax over classes."""

    def __init__(self, features: int, hidden: int = 64, classes: int = 16) -> None:
        super().__init__()
        self.w1, self.w2 = nn.Linear(features, hidden, bias=False), nn.Linear(hidden, classes, bias=False)

    def forward(self, indptr: Tensor, indices: Tensor, values: Tensor, x: Tensor) -> Tensor:
        h = torch.relu(spmm_csr(indptr, indices, values, self.w1(x)))
        return torch.log_softmax(spmm_csr(indptr, indices, values, self.w2(h)), dim=-1)


def random_csr(nodes: int, density: float, device: str) -> tuple[Tensor, Tensor, Tensor]:
    """A CSR adjacency with about ``density * nodes**2`` nonzeros (values only materialised off ``meta``)."""
    nnz = max(nodes, round(density * nodes * nodes))
    if device == "meta":
        return (torch.empty(nodes + 1, dtype=torch.int64), torch.empty(nnz, dtype=torch.int64), torch.empty(nnz))
    per_row = torch.full((nodes,), nnz // nodes, dtype=torch.int64)
    per_row[: nnz % nodes] += 1
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64), per_row.cumsum(0)])
    return indptr, torch.randint(0, nodes, (nnz,)), torch.rand(nnz)


@family("gcn", n=(1024, 4096, 16384), f=(128, 512), d=(0.001, 0.01), default="n4096-f128-d0.001")
def gcn(n: int, f: int, d: float, device: str) -> Built:
    return Gcn(f), (*random_csr(n, d, device), torch.randn(n, f, device=device))
