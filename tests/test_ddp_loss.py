"""Under DDP the contrastive loss spans the global batch: 2 gloo processes == 1 process.

Two CPU processes (torch.multiprocessing, forked, gloo) each hold part of a fixed global batch, with
different batch sizes and caption lengths (exercising the padded gather). Their loss value must
equal the single-process loss on the whole batch, and the DDP-averaged parameter gradients must
equal the single-process gradients.
"""

from __future__ import annotations

import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from grounding import distributed as gdist
from grounding.contrastive import cross_modal_contrastive_loss
from grounding.vgbert.match_map import match_map_scores

SIZES = (3, 2)  # images per rank
LENGTHS = (5, 4)  # caption length (padded) per rank
N, D_IN, D = 4, 6, 8


def _global_batch():
    g = torch.Generator().manual_seed(0)
    b = sum(SIZES)
    v_in = torch.randn(b, N, D_IN, generator=g)
    w_in = torch.randn(b, max(LENGTHS), D_IN, generator=g)
    mask = torch.ones(b, max(LENGTHS), dtype=torch.bool)
    mask[SIZES[0]:, LENGTHS[1]:] = False  # rank 1's captions are shorter
    mask[1, 3:] = False  # and one caption of rank 0 has padding of its own
    return v_in, w_in, mask


class _Heads(torch.nn.Module):
    """Stand-ins for the two streams' projection heads."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.v, self.w = torch.nn.Linear(D_IN, D), torch.nn.Linear(D_IN, D)

    def forward(self, v_in, w_in):
        return self.v(v_in), self.w(w_in)


def _loss(model, v_in, w_in, mask):
    # The DDP wrapper's forward arms its gradient-averaging hooks; gathers are no-ops in 1 process.
    v, w = model(v_in, w_in)
    v, w = gdist.gather_with_grad(v), gdist.gather_with_grad(w)
    return cross_modal_contrastive_loss(match_map_scores(v, w, gdist.gather_no_grad(mask)), 0.1)


def _worker(rank, world, port, out):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        v_in, w_in, mask = _global_batch()
        start = sum(SIZES[:rank])
        rows = slice(start, start + SIZES[rank])
        t = LENGTHS[rank]
        ddp = torch.nn.parallel.DistributedDataParallel(_Heads())
        losses = _loss(ddp, v_in[rows], w_in[rows, :t], mask[rows, :t])
        losses["loss"].backward()
        grads = {n: p.grad.clone() for n, p in ddp.module.named_parameters()}
        torch.save({"loss": {k: v.item() for k, v in losses.items()}, "grads": grads}, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_gather_is_noop_without_process_group():
    x = torch.randn(3, 2, requires_grad=True)
    assert gdist.gather_with_grad(x) is x and gdist.world_size() == 1 and gdist.rank() == 0


def test_two_process_loss_and_gradients_equal_single_process(tmp_path):
    # fork: the children inherit the imported torch (a spawn re-imports it: ~20 s on a loaded machine)
    mp.start_processes(_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True, start_method="fork")
    v_in, w_in, mask = _global_batch()
    model = _Heads()
    single = _loss(model, v_in, w_in, mask)
    single["loss"].backward()
    for rank in range(2):
        res = torch.load(tmp_path / f"rank{rank}.pt")
        for key in ("loss", "loss_l", "loss_v"):
            assert abs(res["loss"][key] - single[key].item()) < 1e-5, (rank, key)
        for name, p in model.named_parameters():
            assert torch.allclose(res["grads"][name], p.grad, atol=1e-5), (rank, name)
