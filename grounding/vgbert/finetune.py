"""VG-BERT stage 2: relational finetune on Visual Genome (§3.2-3.3, App. A.3) as a LightningModule.

:class:`RelationalFinetune` starts from a stage-1 checkpoint (``init_from``: the streams under
``model.visual.*`` / ``model.language.*``; the stage-1 projection heads are dropped), keeps the CNN
frozen, refines the visual self-attention layer and the top l = 2 BERT layers, and trains the
cross-modal attention, bilinear relation module and auxiliary classifier with
Loss_rel + Loss_obj + object cross-entropy (each switchable for the Table 5 ablation).

The network arrives built (``net``: :class:`VGBertRelational`). Relation and object label sets come
from the DataModule (``relation_labels`` / ``object_classes``, e.g. the 114 / 55 of
``data_modules.vg_cleaning``; the CLI links them and their sizes into the network) and are stored in
the checkpoint's hyperparameters. Metrics on val/test: relation top-1 / top-10 and object top-1.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from torchmetrics.classification import MulticlassAccuracy

from grounding.checkpoints import load_submodules, read_checkpoint
from grounding.lightning import GroundingModule, LRSchedulerCallable, OptimizerCallable, default_optimizer
from grounding.nets import check_choices
from grounding.vgbert.relational import LOSS_NORMALISATION, VGBertRelational, relational_losses

DROP_LOSS = ("none", "rel", "obj", "aux")  # Table 5's rows: every term, or one left out


@dataclass(frozen=True)
class RelationalLosses:
    """Stage 2's objective, paper values in brackets: temperature tau [1.0]; ``use_loss_rel`` / ``use_loss_obj`` /
    ``use_object_loss``: Loss_rel, Loss_obj and the auxiliary object cross-entropy [all; Table 5 switches one off];
    ``mask_same_pair``: a pair's other annotated predicates are not its negatives [True]; ``drop_loss`` (``none`` |
    ``rel`` | ``obj`` | ``aux``: one Table 5 row, for sweeps; it turns off the term it names); ``loss_normalisation``
    [``image``: each term summed over the batch's triplets / objects and divided by its images, as the official
    traintest.py (stage2_paper.yaml); ``triplet`` (default, the recorded world runs): averaged over them]."""

    temperature: float = 1.0
    use_loss_rel: bool = True
    use_loss_obj: bool = True
    use_object_loss: bool = True
    mask_same_pair: bool = True
    drop_loss: str = "none"
    loss_normalisation: Literal["triplet", "image"] = "triplet"

    def __post_init__(self):
        check_choices(self, "losses.", drop_loss=DROP_LOSS, loss_normalisation=LOSS_NORMALISATION)


class RelationalFinetune(GroundingModule):
    """VG-BERT relational grounding (Fig. 2); monitors ``val/relation_top1`` (max).

    ``net``: the built :class:`VGBertRelational` (its architecture, paper values in brackets:
    text_encoder [bert-base-uncased], backbone [vgg16], trainable_layers l [2], freeze_query_key
    [True, as in stage 1 App. A.2], dropout [0.1], visual_heads [12: the stage-1 visual
    self-attention], num_heads h of the cross-modal attention [8], relation_dim d [32],
    query_pooling ["tokens": each description token attends, outputs averaged]; engineering
    additions, off in the paper: key_position ("keys" | "keys_values": a fixed 2D sinusoidal location
    encoding on the cross-attention keys / values) and spatial_centroid (each object's attention
    centroid (x, y) feeds the subject/object d = 32 maps; spatial_scale [1.0] multiplies it)). Its
    num_relations / num_object_classes and this module's relation_labels / object_classes come from
    the DataModule (linked by the CLI).

    Training options: init_from [a stage-1 checkpoint; None trains from the pretrained encoders], losses (the
    temperature, the loss terms and their normalisation: :class:`RelationalLosses`), top_k [(1, 10)],
    feature_cache [True].
    """

    monitor = "val/relation_top1"
    monitor_mode = "max"
    # what init_from must be (checked by `python -m grounding` before any model is built)
    init_from_checkpoint = ("stage-1", ("model.visual.", "model.language."))

    def __init__(self, net: VGBertRelational, relation_labels: list[str], object_classes: list[str],
                 init_from: str | None = None, losses: RelationalLosses = RelationalLosses(),
                 top_k: tuple[int, ...] = (1, 10), feature_cache: bool = True, feature_cache_dir: str | None = None,
                 optimizer: OptimizerCallable = default_optimizer, lr_scheduler: LRSchedulerCallable | None = None):
        super().__init__(optimizer, lr_scheduler)
        # the terms trained: the use_* switches less the one drop_loss names (recorded so, as the checkpoint trained)
        losses = dataclasses.replace(losses, use_loss_rel=losses.use_loss_rel and losses.drop_loss != "rel",
                                     use_loss_obj=losses.use_loss_obj and losses.drop_loss != "obj",
                                     use_object_loss=losses.use_object_loss and losses.drop_loss != "aux")
        if not (losses.use_loss_rel or losses.use_loss_obj or losses.use_object_loss):
            raise ValueError("use_loss_rel, use_loss_obj and use_object_loss are all False: enable at least one.")
        if losses.temperature <= 0:
            raise ValueError(f"losses.temperature must be > 0; got {losses.temperature}")
        if relation_labels is None or object_classes is None or len(relation_labels) < 2 or len(object_classes) < 2:
            raise ValueError("RelationalFinetune needs at least 2 relation labels and 2 object classes; got "
                             f"{relation_labels!r} / {object_classes!r}. The CLI links them from a "
                             "VisualGenomeDataModule; check its label mapping / data.")
        self.save_hyperparameters(ignore=["net", "optimizer", "lr_scheduler"])
        self.losses = losses
        self.hparams.update(losses=dataclasses.asdict(losses), relation_labels=list(relation_labels),
                            object_classes=list(object_classes))
        self.model = self.adopt_net(net)
        sizes = (self.model.init_args["num_relations"], self.model.init_args["num_object_classes"])
        if sizes != (len(relation_labels), len(object_classes)):
            raise ValueError(f"The network scores {sizes[0]} relations / {sizes[1]} object classes but "
                             f"{len(relation_labels)} / {len(object_classes)} labels were given.")
        self.feature_cache, self.feature_cache_dir = feature_cache, feature_cache_dir
        self._init_loaded = False
        metrics = {}
        for split in ("val", "test"):
            for k in top_k:
                kk = min(int(k), len(relation_labels))
                if kk < k:
                    warnings.warn(f"relation top-{k}: only {len(relation_labels)} relation labels, using top-{kk}.",
                                  stacklevel=2)
                metrics[f"{split}_relation_top{k}"] = MulticlassAccuracy(len(relation_labels), top_k=kk,
                                                                         average="micro", ignore_index=-1)
            metrics[f"{split}_object_top1"] = MulticlassAccuracy(len(object_classes), top_k=1, average="micro",
                                                                 ignore_index=-1)
        self.metrics = torch.nn.ModuleDict(metrics)

    def setup(self, stage: str) -> None:
        dm = self.trainer.datamodule if self._trainer is not None else None
        if dm is not None and hasattr(dm, "relation_labels"):
            labels = (list(dm.relation_labels), list(dm.object_classes))
            if labels != (self.hparams.relation_labels, self.hparams.object_classes):
                raise ValueError("The DataModule's relation labels / object classes differ from the model's "
                                 f"({len(labels[0])}/{len(labels[1])} vs {len(self.hparams.relation_labels)}/"
                                 f"{len(self.hparams.object_classes)}): use the same label mapping as the checkpoint.")
        if stage == "fit" and self.hparams.init_from and not self._init_loaded and not self.trainer.ckpt_path:
            self.load_stage1(self.hparams.init_from)

    def frozen_backbone(self) -> torch.nn.Module:
        """The frozen CNN whose maps the feature-cache callback stores."""
        return self.model.visual.backbone

    def load_stage1(self, path: str | Path) -> None:
        """Load the visual and language streams of a stage-1 (GroundingPretrain) checkpoint."""
        arch = self.model.init_args
        ckpt = read_checkpoint(path, "stage-1")
        load_submodules(self.model, ckpt, {"model.visual.": "visual", "model.language.": "language"}, path, "stage-1",
                        {key: arch[key] for key in ("text_encoder", "backbone", "visual_heads")})
        self._init_loaded = True

    # ------------------------------------------------------------------ steps
    def _losses(self, batch, out):
        h = self.losses
        return relational_losses(out["relation_scores"], out["object_logits"], batch["triplet_subject"],
                                 batch["triplet_object"], batch["triplet_predicate"], batch["object_labels"],
                                 h.temperature, h.use_loss_rel, h.use_loss_obj, h.use_object_loss, h.mask_same_pair,
                                 h.loss_normalisation, batch["images"].shape[0])

    def training_step(self, batch, batch_idx):
        out = self.model(batch)
        losses = self._losses(batch, out)
        b = batch["images"].shape[0]
        for k, v in losses.items():
            self.log(f"train/{k}", v, prog_bar=k == "loss", batch_size=b)
        return losses["loss"]

    def _eval_step(self, batch, split: str):
        out = self.model(batch)
        losses = self._losses(batch, out)
        b = batch["images"].shape[0]
        self.log(f"{split}/loss", losses["loss"], batch_size=b, sync_dist=True)
        for k in self.hparams.top_k:
            m = self.metrics[f"{split}_relation_top{k}"]
            m.update(out["relation_scores"], batch["triplet_predicate"])
            self.log(f"{split}/relation_top{k}", m, prog_bar=k == 1, batch_size=b)
        m = self.metrics[f"{split}_object_top1"]
        m.update(out["object_logits"], batch["object_labels"])
        self.log(f"{split}/object_top1", m, batch_size=b)

    def validation_step(self, batch, batch_idx, dataloader_idx: int = 0):
        self._eval_step(batch, "val")

    def test_step(self, batch, batch_idx, dataloader_idx: int = 0):
        self._eval_step(batch, "test")

    def predict_step(self, batch, batch_idx, dataloader_idx: int = 0, top: int = 5):
        """Fig. 6: the top relation labels of every annotated pair and each object's class."""
        out = self.model(batch, return_attention=True)
        rel, obj = self.hparams.relation_labels, self.hparams.object_classes
        top = min(top, len(rel))
        scores, ids = out["relation_scores"].softmax(-1).topk(top, dim=-1)
        names = batch.get("object_names") or [""] * len(batch["object_labels"])
        s, o = batch["triplet_subject"].tolist(), batch["triplet_object"].tolist()
        return {
            "triplets": [{"subject": names[si], "object": names[oi],
                          "true": rel[p] if p >= 0 else None,
                          "predicted": [(rel[j], float(q)) for j, q in zip(i_row, q_row)]}
                         for si, oi, p, i_row, q_row in zip(s, o, batch["triplet_predicate"].tolist(), ids.tolist(),
                                                            scores.tolist())],
            "objects": [{"name": n, "predicted": obj[j], "true": obj[t] if t >= 0 else None}
                        for n, j, t in zip(names, out["object_logits"].argmax(-1).tolist(),
                                           batch["object_labels"].tolist())],
            "attention": out["attention"].cpu(),
        }


__all__ = ["RelationalFinetune"]
