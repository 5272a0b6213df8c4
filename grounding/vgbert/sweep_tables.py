"""VG-BERT's sweep tables laid out as the paper's: Fig. 3 and Fig. 12 (grounding depth k x Q/K x dropout), App. A.2
Table 2 (contrastive loss terms) and App. A.3.3 Table 5 (stage-2 losses left out), from the runs' sweep results."""

from __future__ import annotations

from grounding.summary_tables import RETRIEVAL, Table, metric, param


def _dropout_label(value, several: bool) -> str:
    return "" if not several else (", dropout (config)" if value is None else f", dropout {value}")


def layer_tables(results: list[dict]) -> list[Table]:
    """Fig. 3 and Fig. 12 from runs over trainable_layers x freeze_query_key (x dropout). k = 0 trains no BERT
    layer, so its run fills both Q/K columns; Fig. 12's k = 0 row without such a run is the reference's (the
    plain encoder's) silhouette, which every report holds."""
    runs = [r for r in results if param(r, "trainable_layers") is not None]
    ks = sorted({int(param(r, "trainable_layers")) for r in runs} | {0})
    dropouts = sorted({param(r, "dropout") for r in runs}, key=lambda d: (d is None, d or 0))
    several = len(dropouts) > 1
    columns = [(qk, d) for d in dropouts for qk in (True, False)]
    labels = [f"Q/K {'frozen' if qk else 'trainable'}{_dropout_label(d, several)}" for qk, d in columns]

    def find(k, qk, d):
        for r in runs:
            if int(param(r, "trainable_layers")) == k and param(r, "dropout") == d and (
                    k == 0 or bool(param(r, "freeze_query_key", True)) == qk):
                return r
        return None

    fig3 = Table("fig3", "Fig. 3 (App. A.2): cross-modal retrieval by grounding depth k and Q/K", "k", labels,
                 [*RETRIEVAL, ("learnable_parameters_M", "learnable parameters (M)", 2)],
                 "R@1 of the test split (the paper: COCO val2017, 5K images); k = 0: the whole language stream "
                 "frozen (Bert), one run for both Q/K columns.")
    fig12 = Table("fig12", "Fig. 12 (App. B.3.2): word categorisation by k, Q/K and dropout", "k", labels,
                  [("space:silhouette_mean", "mean category silhouette (Eqs. 12-14)", 4)],
                  "k = 0: the plain text encoder (the report's reference row, or the k = 0 run's, which is the same "
                  "frozen encoder).")
    reference = next((metric(r, "reference:silhouette_mean") for r in results
                      if metric(r, "reference:silhouette_mean") is not None), None)
    for k in ks:
        cells3, cells12 = [], []
        for qk, d in columns:
            r = find(k, qk, d)
            params_m = None if r is None or metric(r, "learnable_parameters") is None else \
                metric(r, "learnable_parameters") / 1e6
            cells3.append([None if r is None else metric(r, m) for m, _, _ in RETRIEVAL] + [params_m])
            sil = None if r is None else metric(r, "space:silhouette_mean")
            cells12.append([reference if sil is None and k == 0 else sil])
        label = "0 (Bert)" if k == 0 else str(k)
        if any(any(v is not None for v in c) for c in cells3) or k != 0:
            fig3.add(label, cells3)
        fig12.add(label, cells12)
    return [fig3, fig12]


TABLE2_ROWS = [("both", "Loss_l + Loss_v", (25.3, 23.9)), ("l", "Loss_l", (25.5, 17.4)), ("v", "Loss_v", (1.4, 25.5))]
TABLE5_ROWS = [("none", "Combined loss", (97.71, 64.26, 95.21)), ("aux", "No auxiliary loss", (0.60, 64.19, 94.99)),
               ("rel", "No Loss_rel", (97.95, 29.97, 68.78)), ("obj", "No Loss_obj", (98.39, 64.14, 95.14))]


def loss_table(results: list[dict]) -> Table:
    """App. A.2 Table 2: retrieval R@1 by the contrastive loss terms (Grounded-8)."""
    t = Table("table2", "Table 2 (App. A.2): cross-modal contrastive loss terms", "loss", ["this sweep", "paper"],
              [*RETRIEVAL, ("space:silhouette_mean", "mean category silhouette", 4)],
              "Test-split R@1 (%); the paper's column: its Table 2 (COCO val2017, Grounded-8; no silhouette).")
    for key, label, paper in TABLE2_ROWS:
        r = next((r for r in results if str(param(r, "loss_terms")) == key), None)
        ours = [None if r is None else metric(r, m) for m, _, _ in t.metrics]
        t.add(label, [ours, [*paper, None]])
    return t


def relation_table(results: list[dict]) -> Table:
    """App. A.3.3 Table 5: stage-2 test accuracy (%) with one loss left out."""
    names = [("test/object_top1", "object top-1", 2), ("test/relation_top1", "relation top-1", 2),
             ("test/relation_top10", "relation top-10", 2)]
    t = Table("table5", "Table 5 (App. A.3.3): stage-2 losses, one left out", "model", ["this sweep", "paper"],
              [*names, ("space:silhouette_mean", "mean category silhouette", 4)],
              "Test accuracy in % (the stage logs fractions; x100 here); the paper's column: its Table 5.")
    for key, label, paper in TABLE5_ROWS:
        r = next((r for r in results if str(param(r, "drop_loss")) == key), None)
        ours = [None if r is None or metric(r, m) is None else 100.0 * metric(r, m) for m, _, _ in names]
        ours.append(None if r is None else metric(r, "space:silhouette_mean"))
        t.add(label, [ours, [*paper, None]])
    return t
