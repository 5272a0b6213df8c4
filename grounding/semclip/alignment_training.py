"""LightningModule training the semantic alignment transform Γ_t (SemCLIP §4, Eq. 8).

Γ_t (``AlignmentTransform``: FC–ReLU–FC–ReLU–FC) maps VLM text embeddings to their STE targets
under Eq. 8's squared error, AdamW 1e-3 (paper: batch 512, 200 epochs, hidden width 4096). The
widths follow the data: ``in_dim`` / ``out_dim`` left unset are read from the
``AlignmentPairsDataModule`` (VLM and STE sizes) at setup and stored in the hyperparameters.
Logged: train/loss, val/loss and val/recovery_error, the fraction of held-out pairs whose
prediction's nearest target (cosine) is not their own (the paper reports < 4% after training).
When training ends, Γ_t is written to ``export_path`` (``load_transform`` reads it, or the checkpoint).
"""

from __future__ import annotations

import torch

from grounding.lightning import GroundingModule, LRSchedulerCallable, OptimizerCallable
from grounding.semclip.alignment import AlignmentTransform, alignment_loss, recovery_error, save_transform


def alignment_default_optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-3)  # §4: AdamW, initial learning rate 0.001


class SemCLIPAlignment(GroundingModule):
    """Γ_t (``net``: the built :class:`AlignmentTransform`) trained on (VLM text, STE target) pairs;
    monitors ``val/loss``. The transform's ``in_dim`` / ``out_dim`` are the pairs' VLM and STE widths
    (linked by the CLI from the alignment-pairs DataModule)."""

    monitor = "val/loss"
    monitor_mode = "min"

    def __init__(self, net: AlignmentTransform, export_path: str | None = None,
                 optimizer: OptimizerCallable = alignment_default_optimizer,
                 lr_scheduler: LRSchedulerCallable | None = None):
        super().__init__(optimizer, lr_scheduler)
        self.save_hyperparameters(ignore=["net", "optimizer", "lr_scheduler"])
        self.transform = self.adopt_net(net)
        self._val: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.provenance: dict = {}

    def setup(self, stage: str):
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if dm is not None and hasattr(dm, "vlm_dim"):
            dims, own = (dm.vlm_dim, dm.ste_dim), (self.transform.init_args["in_dim"], self.transform.init_args["out_dim"])
            if own != dims:
                raise ValueError(f"The transform maps {own[0]} -> {own[1]} but the pairs are {dims[0]} (VLM) -> "
                                 f"{dims[1]} (STE): train on the pairs of the VLM and STE it was built for.")
            self.provenance = {k: v for k, v in dict(dm.hparams).items() if not k.startswith("_")}  # the pairs' settings

    def forward(self, vlm_text: torch.Tensor) -> torch.Tensor:
        return self.transform(vlm_text)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = alignment_loss(self.transform(x), y)
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=True, batch_size=len(x))
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        pred = self.transform(x)
        self.log("val/loss", alignment_loss(pred, y), prog_bar=True, batch_size=len(x))
        self._val.append((pred.detach().cpu(), y.detach().cpu()))

    def on_validation_epoch_end(self):
        if self._val:
            pred, y = (torch.cat(t) for t in zip(*self._val))
            self.log("val/recovery_error", recovery_error(pred, y), prog_bar=True)
        self._val = []

    def on_save_checkpoint(self, checkpoint):
        checkpoint["semclip_alignment"] = self.provenance

    def on_load_checkpoint(self, checkpoint):
        self.provenance = checkpoint.get("semclip_alignment") or {}

    def on_train_end(self):
        if self.hparams.export_path and self.trainer.is_global_zero:
            out = save_transform(self.transform.cpu(), self.hparams.export_path, **self.provenance)
            self.transform.to(self.device)
            print(f"alignment transform written to {out}")
