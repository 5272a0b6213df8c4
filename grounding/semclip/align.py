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
    """Γ_t trained on (VLM text, STE target) pairs; monitors ``val/loss``."""

    monitor = "val/loss"
    monitor_mode = "min"

    def __init__(self, in_dim: int | None = None, out_dim: int | None = None, hidden: int = 4096,
                 export_path: str | None = None, optimizer: OptimizerCallable = alignment_default_optimizer,
                 lr_scheduler: LRSchedulerCallable | None = None):
        super().__init__(optimizer, lr_scheduler)
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler"])
        self.transform: AlignmentTransform | None = None
        if in_dim is not None and out_dim is not None:
            self._build(in_dim, out_dim)
        self._val: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.provenance: dict = {}

    def _build(self, in_dim: int, out_dim: int):
        self.transform = AlignmentTransform(in_dim, out_dim, self.hparams.hidden)
        self.hparams.in_dim, self.hparams.out_dim = in_dim, out_dim

    def setup(self, stage: str):
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if dm is not None and hasattr(dm, "vlm_dim"):
            dims = (dm.vlm_dim, dm.ste_dim)
            if self.transform is None:
                self._build(*dims)
            elif (self.hparams.in_dim, self.hparams.out_dim) != dims:
                raise ValueError(f"The transform maps {self.hparams.in_dim} -> {self.hparams.out_dim} but the pairs are "
                                 f"{dims[0]} (VLM) -> {dims[1]} (STE); leave in_dim/out_dim unset to follow the data.")
            self.provenance = {k: v for k, v in dict(dm.hparams).items() if not k.startswith("_")}  # the pairs' settings
        if self.transform is None:
            raise ValueError("SemCLIPAlignment needs in_dim and out_dim, or a DataModule with vlm_dim/ste_dim "
                             "(grounding.semclip.alignment_pairs.AlignmentPairsDataModule).")

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
        hp = checkpoint.get("hyper_parameters") or {}
        if self.transform is None and hp.get("in_dim") is not None:
            self._build(hp["in_dim"], hp["out_dim"])

    def on_train_end(self):
        if self.hparams.export_path and self.trainer.is_global_zero:
            out = save_transform(self.transform.cpu(), self.hparams.export_path, **self.provenance)
            self.transform.to(self.device)
            print(f"alignment transform written to {out}")
