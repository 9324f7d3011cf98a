"""``mnemos reranker check``: a trained cross-encoder's logits on held-out LoCoMo pairs, and its speed.

A smoke test of a model directory (:func:`run_check`), not a retrieval metric: NDCG lives in
:mod:`bench.quality.run`.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

__all__ = ["run_check"]


def run_check(
    *, model_dir: Path, data: Path, n_questions: int = 50, speed_pairs: int = 300, seed: int = 0, threads: int = 2
) -> int:
    """Sanity-check a trained model on conversations it never saw; print mean logits and pairs/s.

    For ``n_questions`` sampled held-out questions (categories 1-4, with evidence) it scores
    (question, one evidence turn), (question, a random other turn) and (question, the best BM25
    turn that is not evidence) and prints each mean logit and how often evidence outscores the
    other. Then it times ``CrossEncoder.predict`` on ``speed_pairs`` held-out pairs (batch 32,
    after one warm-up batch). Held-out = the provenance's ``held_out_conversations``. This is a
    smoke test, not a retrieval metric (NDCG lives in ``bench.quality.run``).

    Returns 0, or 2 when the model has no provenance or no held-out conversation is in ``data``.
    """
    import json
    import random

    import bm25s
    import numpy as np
    import torch
    from sentence_transformers.cross_encoder import CrossEncoder

    from bench.common.datasets import load_locomo
    from bench.training.pairs import turn_passages
    from mnemos.tokenizer import tokenize
    from workers.runtime.models import PROVENANCE_FILE

    torch.set_num_threads(threads)
    try:
        provenance = json.loads((model_dir / PROVENANCE_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        click.echo(f"error: cannot read {model_dir / PROVENANCE_FILE}: {exc}", err=True)
        return 2
    trained_on = set(provenance.get("training_conversations", []))
    convs = [c for c in load_locomo(data) if c.conversation_id in set(provenance.get("held_out_conversations", []))]
    convs = [c for c in convs if c.conversation_id not in trained_on]
    if not convs:
        click.echo("error: no held-out conversation of this model is in the data file", err=True)
        return 2
    rng = random.Random(seed)
    triples = []  # (question, evidence text, random text, bm25 text)
    for conv in convs:
        passages = turn_passages(conv)
        ids = list(passages)
        texts = list(passages.values())
        index = bm25s.BM25()
        index.index([tokenize(t) or ["\u2205"] for t in texts], show_progress=False)
        for q in conv.questions:
            if q.category not in (1, 2, 3, 4) or not q.relevant_turn_ids or not tokenize(q.text):
                continue
            others = [i for i, turn_id in enumerate(ids) if turn_id not in q.relevant_turn_ids]
            ranked, _ = index.retrieve([tokenize(q.text)], k=min(30, len(texts)), show_progress=False)
            hard = next((int(i) for i in ranked[0] if ids[int(i)] not in q.relevant_turn_ids), rng.choice(others))
            gold = ids.index(rng.choice(sorted(q.relevant_turn_ids)))
            triples.append((q.text, texts[gold], texts[rng.choice(others)], texts[hard]))
    triples = rng.sample(triples, min(n_questions, len(triples)))
    # Raw logits (what mnemos.rerank and the deep-pass threshold use), whatever the saved activation.
    model = CrossEncoder(str(model_dir), max_length=128, device="cpu", activation_fn=torch.nn.Identity())
    score = {
        name: np.asarray(model.predict([(t[0], t[col]) for t in triples], batch_size=32, show_progress_bar=False))
        for col, name in ((1, "evidence"), (2, "random"), (3, "bm25_non_evidence"))
    }
    click.echo(f"model {model_dir} (trained on {sorted(trained_on)}); {len(triples)} held-out questions "
               f"from {[c.conversation_id for c in convs]}")
    for name, values in score.items():
        click.echo(f"  mean logit (question, {name} turn): {values.mean():+.3f} (sd {values.std():.3f})")
    for name in ("random", "bm25_non_evidence"):
        click.echo(f"  evidence > {name}: {(score['evidence'] > score[name]).mean():.1%}")
    if speed_pairs > 0:
        questions = [q.text for c in convs for q in c.questions]
        turns = [text for c in convs for text in turn_passages(c).values()]
        pairs = [(rng.choice(questions), rng.choice(turns)) for _ in range(speed_pairs)]
        model.predict(pairs[:32], batch_size=32, show_progress_bar=False)  # warm-up
        started = time.perf_counter()
        model.predict(pairs, batch_size=32, show_progress_bar=False)
        seconds = time.perf_counter() - started
        click.echo(f"  speed: {speed_pairs} pairs in {seconds:.2f} s = {speed_pairs / seconds:.1f} pairs/s "
                   f"(batch 32, max_length 128, {threads} threads)")
    return 0
