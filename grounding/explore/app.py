"""The retrieval explorer's page: :class:`Explorer` answers (no web code, tested directly), :func:`build_app` lays it
out in Gradio.

Text → images: every chosen model's top-k photos side by side with their scores, a ✓ on the photos whose caption
is the query. Cross-encoders rerank the first stage's top-K (``rerank_top_k``), with a progress bar. Clicking a photo
explains it: VG-BERT's match map of the chosen word over the photo, COMPOSER's Concept & Relation Graph with each
concept's score on the photo; SemCLIP's synonym stability is shown with every query. Image → captions: a photo of the
gallery (picked by name from the gallery's list: no path from the browser is ever opened), each model's top captions.
"""

from __future__ import annotations

import html
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from grounding.explore.models import (
    MAX_QUERY_CHARS,
    ConceptNode,
    CrossModel,
    ExplorerModel,
    Gallery,
    LoadReport,
    MatchMapModel,
    Ranked,
    SemCLIPModel,
)

THUMB = 96
HEAT_SIZE = 256


class QueryError(ValueError):
    """A query the page answers with a message instead of results."""


def check_query(query: str | None) -> str:
    query = " ".join((query or "").split())
    if not query:
        raise QueryError("Type a query first (e.g. one of the example captions).")
    if len(query) > MAX_QUERY_CHARS:
        raise QueryError(f"The query has {len(query)} characters; keep it under {MAX_QUERY_CHARS} (a caption is ~60).")
    if not any(ch.isalnum() for ch in query):  # "?!..." or emoji: every model would still rank, on nothing
        raise QueryError(f"The query {query!r} has no words (only punctuation or symbols); type a caption with words, "
                         "e.g. a dog runs on the grass.")
    return query


@dataclass
class SearchResult:
    query: str
    k: int
    ranked: dict[str, Ranked]
    truth: set[int]
    first_stage: str | None
    errors: dict[str, str] = field(default_factory=dict)


class Explorer:
    """Loaded models over one gallery, and the answers the page shows."""

    def __init__(self, gallery: Gallery, report: LoadReport, first_stage: ExplorerModel | None, rerank_top_k: int = 20,
                 top_k: int = 5):
        self.gallery, self.report, self.first_stage = gallery, report, first_stage
        self.rerank_top_k, self.top_k = rerank_top_k, top_k
        self.models = {m.name: m for m in report.models}

    # ------------------------------------------------------------------------------------------ text -> images
    def search(self, query: str, names: list[str] | None = None, k: int | None = None, progress=None) -> SearchResult:
        query, k = check_query(query), int(k or self.top_k)
        names = [n for n in (names or list(self.models)) if n in self.models]
        ranked, errors = {}, {}
        candidates, first_name = None, None
        if any(self.models[n].cross_encoder for n in names) and self.first_stage is not None:
            first = self.first_stage.rank_images(query, max(self.rerank_top_k, k))
            candidates, first_name = torch.tensor(first.rows), self.first_stage.name
        for i, name in enumerate(names):
            model = self.models[name]
            if progress is not None:
                progress(i / len(names), desc=name)
            try:
                if model.cross_encoder:
                    ranked[name] = model.rank_images(query, k, candidates)
                    ranked[name].note = (f"reranked the top {len(candidates)} of {first_name}" if candidates is not None
                                         else "every photo cross-encoded")
                else:
                    ranked[name] = model.rank_images(query, k)
            except Exception as e:  # noqa: BLE001 - one model's failure is its panel's message, the others still answer
                errors[name] = " ".join(str(e).split())[:300] or type(e).__name__
        return SearchResult(query, k, ranked, self.gallery.matching_images(query), first_name, errors)

    def result_items(self, result: SearchResult, name: str) -> list[tuple[str, str]]:
        ranked = result.ranked.get(name)
        if ranked is None:
            return []
        return [(str(self.gallery.image_paths[r]), f"{i + 1}. {s:.3f}{' ✓' if r in result.truth else ''}")
                for i, (r, s) in enumerate(zip(ranked.rows, ranked.scores))]

    def summary(self, result: SearchResult) -> str:
        lines = [f"**{html.escape(result.query)}**"]
        if result.truth:
            lines.append(f"a caption of {len(result.truth)} gallery photo(s): ✓ marks it")
        else:
            lines.append("not a gallery caption (no ground truth)")
        times = ", ".join(f"{n} {1000 * r.seconds:.0f} ms" + (f" ({r.note})" if r.note else "")
                          for n, r in result.ranked.items())
        lines.append(f"times: {times}")
        lines += [f"⚠ {n}: {html.escape(e)}" for n, e in result.errors.items()]
        return "  \n".join(lines)

    # ------------------------------------------------------------------------------------------ why it matched
    @property
    def match_map_model(self) -> MatchMapModel | None:
        return next((m for m in self.models.values() if isinstance(m, MatchMapModel)), None)

    @property
    def composer_model(self) -> CrossModel | None:
        return next((m for m in self.models.values() if isinstance(m, CrossModel) and m.composes), None)

    @property
    def semclip_model(self) -> SemCLIPModel | None:
        return next((m for m in self.models.values() if isinstance(m, SemCLIPModel)), None)

    def words(self, query: str, image: int) -> tuple[list[str], torch.Tensor]:
        model = self.match_map_model
        if model is None:
            return [], torch.zeros(0)
        return model.word_maps(check_query(query), image)

    def heat_map(self, query: str, image: int, word: int) -> np.ndarray | None:
        """The photo (as the model saw it: short side resized, centre crop) with word ``word``'s match map over it."""
        tokens, maps = self.words(query, image)
        if not tokens:
            return None
        word = min(max(int(word), 0), len(tokens) - 1)
        return overlay(self.gallery.image_paths[image], maps[word])

    def crg_html(self, query: str, image: int) -> str:
        model = self.composer_model
        if model is None:
            return "<p>No COMPOSER checkpoint loaded.</p>"
        tree = model.concept_tree(check_query(query), image)
        return ('<div class="crg-tree"><p>COMPOSER\'s Concept &amp; Relation Graph of the query, each concept\'s score '
                f"{model.score_formula} on photo {html.escape(self.gallery.image_paths[image].name)}:</p><ul>{_tree_html(tree)}</ul></div>")

    def synonyms(self, query: str, k: int | None = None) -> tuple[str, Image.Image | None]:
        model = self.semclip_model
        if model is None:
            return "<p>No SemCLIP store loaded.</p>", None
        k = int(k or self.top_k)
        rows = model.synonyms(check_query(query), k)
        if len(rows) == 1:
            return ("<p>No WordNet synonym of the query's nouns (SemCLIP's STE query needs a noun it knows).</p>",
                    None)
        body = "".join(f"<tr><td>{html.escape(r.query)}</td><td>{r.semclip_overlap:.2f}</td><td>{r.vlm_overlap:.2f}</td></tr>"
                       for r in rows[1:])
        table = (f'<table class="synonyms"><tr><th>synonym query</th><th>SemCLIP overlap@{k}</th>'
                 f"<th>its VLM's overlap@{k}</th></tr>{body}</table>"
                 f"<p>mean overlap@{k}: SemCLIP {np.mean([r.semclip_overlap for r in rows[1:]]):.2f}, "
                 f"VLM {np.mean([r.vlm_overlap for r in rows[1:]]):.2f} (1.00: the synonym retrieves the same photos)</p>")
        return table, contact_sheet([r.query for r in rows], [[self.gallery.image_paths[i] for i in r.semclip_top]
                                                              for r in rows])

    # ------------------------------------------------------------------------------------------ image -> captions
    def captions(self, image: int, names: list[str] | None = None, k: int | None = None) -> str:
        k = int(k or self.top_k)
        if not 0 <= image < len(self.gallery.image_paths):
            raise QueryError("Pick a photo of the gallery.")
        texts, owner = self.gallery.flat_captions, self.gallery.caption_image.tolist()
        candidates = None
        names = [n for n in (names or list(self.models)) if n in self.models]
        if any(self.models[n].cross_encoder for n in names) and self.first_stage is not None:
            candidates = torch.tensor(self.first_stage.rank_captions(image, max(self.rerank_top_k, k)).rows)
        parts = []
        for name in names:
            model = self.models[name]
            try:
                start = time.perf_counter()
                ranked = model.rank_captions(image, k, candidates if model.cross_encoder else None)
                items = "".join(f"<li>{html.escape(texts[r])} <small>{s:.3f}</small>{' ✓' if owner[r] == image else ''}</li>"
                                for r, s in zip(ranked.rows, ranked.scores))
                parts.append(f"<h4>{html.escape(name)} <small>{1000 * (time.perf_counter() - start):.0f} ms</small></h4>"
                             f"<ol>{items}</ol>")
            except Exception as e:  # noqa: BLE001 - shown in the page, the other models still answer
                parts.append(f"<h4>{html.escape(name)}</h4><p>⚠ {html.escape(' '.join(str(e).split())[:300])}</p>")
        return f'<div class="captions">{"".join(parts)}</div>'

    def status(self) -> str:
        g = self.gallery
        lines = [f"Gallery **{html.escape(g.name)}**: {len(g.image_paths)} photos, {len(g.flat_captions)} captions. "
                 f"Models: {', '.join(f'{m.name} ({m.kind})' for m in self.report.models) or 'none'}."]
        if self.first_stage is not None and any(m.cross_encoder for m in self.report.models):
            lines.append(f"Cross-encoders rerank the top {self.rerank_top_k} of {self.first_stage.name}.")
        for name, command, files in self.report.missing:
            lines.append(f"Not trained yet: {name} — `{command}` makes {', '.join(f'`{f}`' for f in files)}")
        for name, reason in self.report.failed:
            lines.append(f"⚠ {name} not loaded: {html.escape(reason)}")
        return "  \n".join(lines)


def _tree_html(node: ConceptNode) -> str:
    colour = "#1a7f37" if node.score >= 0 else "#b42318"
    kids = "".join(_tree_html(c) for c in node.children)
    return (f'<li><span class="concept">{html.escape(node.text)} <b style="color:{colour}">{node.score:+.2f}</b></span>'
            + (f"<ul>{kids}</ul>" if kids else "") + "</li>")


def model_view(path: Path, size: int = HEAT_SIZE) -> Image.Image:
    """The photo's short side resized and centre-cropped square (the models' evaluation transform)."""
    img = Image.open(path).convert("RGB")
    w, h = img.size
    s = min(w, h)
    return img.crop(((w - s) // 2, (h - s) // 2, (w - s) // 2 + s, (h - s) // 2 + s)).resize((size, size))


def overlay(path: Path, heat: torch.Tensor, alpha: float = 0.5) -> np.ndarray:
    """A match map (h, w) upsampled over the photo, min–max scaled, as an RGB array."""
    from matplotlib import colormaps  # here: matplotlib loads only when a heat map is drawn

    base = np.asarray(model_view(path), dtype=np.float32) / 255
    h = torch.nn.functional.interpolate(heat.float()[None, None], size=base.shape[:2], mode="bilinear",
                                        align_corners=False)[0, 0]
    h = (h - h.min()) / (h.max() - h.min()).clamp(min=1e-8)
    colour = colormaps["jet"](h.numpy())[..., :3]
    return (255 * ((1 - alpha) * base + alpha * colour)).clip(0, 255).astype(np.uint8)


def contact_sheet(labels: list[str], rows: list[list[Path]], thumb: int = THUMB) -> Image.Image:
    """One row of thumbnails per query (its top-k), the query written on the left."""
    import textwrap

    from PIL import ImageDraw

    label_w = 220
    k = max((len(r) for r in rows), default=0)
    sheet = Image.new("RGB", (label_w + k * (thumb + 4), len(rows) * (thumb + 4)), "white")
    draw = ImageDraw.Draw(sheet)
    for y, (label, paths) in enumerate(zip(labels, rows)):
        top = y * (thumb + 4)
        lines = textwrap.wrap(label, 34)[:6]
        draw.multiline_text((4, top + max(2, thumb // 2 - 7 * len(lines))), "\n".join(lines), fill="black", spacing=2)
        for x, p in enumerate(paths):
            sheet.paste(model_view(p, thumb), (label_w + x * (thumb + 4), top))
    return sheet


CSS = """
.crg-tree ul { list-style: none; margin: 0; padding-left: 1.2em; border-left: 1px solid #999; }
.crg-tree li { margin: 0.2em 0; }
.crg-tree .concept { border: 1px solid #bbb; border-radius: 4px; padding: 1px 6px; background: #f6f8fa; }
table.synonyms td, table.synonyms th { padding: 2px 8px; }
"""


def build_app(explorer: Explorer):
    """The Gradio page (Blocks) over an :class:`Explorer`."""
    import gradio as gr  # here: Gradio is the explorer's optional extra (pip install -e '.[explore]')

    names = list(explorer.models)
    photo_names = [p.name for p in explorer.gallery.image_paths]
    examples = explorer.gallery.flat_captions[:3]
    with gr.Blocks(title="grounding: retrieval explorer") as app:
        gr.Markdown("# Retrieval explorer")
        gr.Markdown(explorer.status(), elem_id="status")
        state = gr.State({})
        with gr.Tab("Text → images"):
            with gr.Row():
                query = gr.Textbox(label="Query", placeholder=examples[0] if examples else "a dog on the grass",
                                   scale=4, elem_id="query")
                k = gr.Slider(1, 10, value=explorer.top_k, step=1, label="top k", scale=1)
                search = gr.Button("Search", variant="primary", scale=1, elem_id="search")
            chosen = gr.CheckboxGroup(names, value=names, label="Models")
            if examples:
                gr.Examples(examples, inputs=query)
            summary = gr.Markdown(elem_id="summary")
            galleries = []
            with gr.Row():
                for i, name in enumerate(names):
                    galleries.append(gr.Gallery(label=name, columns=2, height=360, allow_preview=False,
                                                elem_id=f"results-{i}"))
            gr.Markdown("### Why it matched — click a photo above")
            selected = gr.Markdown(elem_id="selected")
            with gr.Row():
                with gr.Column():
                    words = gr.Radio([], label="VG-BERT: the word whose match map is drawn", elem_id="words")
                    heat = gr.Image(label="VG-BERT match map", elem_id="heatmap", type="numpy", height=280)
                crg = gr.HTML(elem_id="crg")
            has_semclip = explorer.semclip_model is not None
            synonyms_html = gr.HTML(elem_id="synonyms", visible=has_semclip)
            synonyms_img = gr.Image(label="SemCLIP: each synonym query's top k", type="pil", elem_id="synonym-sheet",
                                    visible=has_semclip)

        with gr.Tab("Image → captions"):
            with gr.Row():
                photo = gr.Dropdown(photo_names, value=photo_names[0] if photo_names else None, label="Photo",
                                    filterable=True, elem_id="photo")
                k2 = gr.Slider(1, 10, value=explorer.top_k, step=1, label="top k")
                go = gr.Button("Find captions", variant="primary", elem_id="find-captions")
            preview = gr.Image(label="Photo", type="pil", height=260)
            captions_out = gr.HTML(elem_id="captions")

        run_search = _search_callback(gr, explorer, names)
        outputs = [summary, state, *galleries, selected, synonyms_html, synonyms_img]
        search.click(run_search, [query, chosen, k], outputs)
        query.submit(run_search, [query, chosen, k], outputs)

        for name, g in zip(names, galleries):
            g.select(_explain_callback(gr, explorer, name), [state], [selected, words, heat, crg])
        words.change(_draw_word_callback(explorer), [state, words], [heat])
        go.click(_captions_callback(explorer, photo_names), [photo, chosen, k2], [preview, captions_out])
    return app


# The page's callbacks, each made for one Explorer (and the Gradio module, which build_app imports lazily).
def _search_callback(gr, explorer: Explorer, names: list[str]):
    """Search: the summary, the state a click reads (the query and every model's ranked photos), each model's photos
    (none for a model not chosen), a hint to click, and SemCLIP's synonym table and sheet; a bad query: its message."""

    def run_search(q, models, kk, progress=gr.Progress()):
        try:
            result = explorer.search(q, models, kk, progress=progress)
        except QueryError as e:
            return [str(e), {}] + [[] for _ in names] + ["", "", None]  # one empty gallery per model
        syn_html, syn_img = "", None
        if explorer.semclip_model is not None and explorer.semclip_model.name in models:
            try:
                syn_html, syn_img = explorer.synonyms(result.query, result.k)
            except Exception as e:  # noqa: BLE001 - shown in the page
                syn_html = f"<p>⚠ SemCLIP synonyms: {html.escape(str(e))}</p>"
        ranked = {n: result.ranked[n].rows for n in result.ranked}
        return ([explorer.summary(result), {"query": result.query, "ranked": ranked}]
                + [explorer.result_items(result, n) if n in models else [] for n in names]
                + ["Click a photo above to see why it matched.", syn_html, syn_img])

    return run_search


def _explain_callback(gr, explorer: Explorer, name: str):
    """A click on model ``name``'s photo: which result it is, the query's words (the most strongly grounded one
    chosen), its VG-BERT match map and COMPOSER's CRG with each concept's score on the photo."""

    def on_select(st, evt: gr.SelectData):
        rows = (st or {}).get("ranked", {}).get(name, [])
        if not rows or evt.index is None or evt.index >= len(rows):
            return "Search first.", gr.update(choices=[], value=None), None, ""
        image, q = rows[evt.index], st["query"]
        tokens, maps = explorer.words(q, image)
        st["image"] = image
        head = f"**{html.escape(name)}**, result {evt.index + 1}: {explorer.gallery.image_paths[image].name}"
        choices = [(f"{t} ({j + 1})", j) for j, t in enumerate(tokens)]
        best = int(maps.flatten(1).amax(1).argmax()) if tokens else None  # the word grounded most strongly
        return (head, gr.update(choices=choices, value=best),
                explorer.heat_map(q, image, best) if tokens else None, explorer.crg_html(q, image))

    on_select.__annotations__["evt"] = gr.SelectData  # a class, not the string postponed annotations leave
    return on_select


def _draw_word_callback(explorer: Explorer):
    """Another word picked: its match map over the clicked photo (nothing before a click)."""

    def draw_word(st, word):
        if not st or "image" not in st or word is None:
            return None
        return explorer.heat_map(st["query"], st["image"], word)

    return draw_word


def _captions_callback(explorer: Explorer, photo_names: list[str]):
    """Image → captions: the picked gallery photo (by name only: no path from the browser is ever opened) and each
    chosen model's top captions."""

    def find_captions(name, models, kk):
        if name not in photo_names:
            return None, "<p>Pick a photo of the gallery.</p>"
        i = photo_names.index(name)
        return model_view(explorer.gallery.image_paths[i]), explorer.captions(i, models, kk)

    return find_captions
