"""Where a reranker's training pairs come from, and what its provenance says about them.

``mnemos reranker train`` (:mod:`bench.training.cli`) combines sources in one run: LoCoMo
conversations, LongMemEval questions (S and oracle files, folds by question) and a JSONL pairs
file. Each becomes a source record in ``mnemos_provenance.json`` with its SPDX licence, file name
and sha256 and the items used (:mod:`workers.runtime.model_licences` reads them back), and the union of
items becomes ``training_conversations``, what the benchmarks refuse to grade the model on.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from bench.training.pairs import PositivePair

__all__ = ["file_sha256", "locomo_source", "longmemeval_sources", "teacher_sources", "training_positives"]


def teacher_sources(teacher: Path, via: str | None = None) -> list[dict[str, object]]:
    """The teacher's training sources as source records marked ``via`` the teacher (default
    ``"distillation teacher <name>"``): a model trained with what another model learned (distilled
    from it, or on negatives it mined) inherits the licences of that model's training data."""
    from workers.runtime.model_licences import training_sources
    from workers.runtime.models import reranker_provenance

    record = reranker_provenance(str(teacher)) or {}
    raw = record.get("sources")
    via = via or f"distillation teacher {teacher.resolve().name}"
    if isinstance(raw, list):
        return [{**src, "via": via} for src in raw if isinstance(src, dict)]
    return [{"name": s.name, "licence": s.licence, "n_items": s.n_items, "via": via}
            for s in training_sources(record)]


def training_positives(data: Path | None, pairs: Path | None, conversations: list[str] | None,
               fold: tuple[int, int] | None,
               provenance: dict[str, object], *, longmemeval: Sequence[Path] = (),
               question_fold: tuple[int, int] | None = None, fold_seed: int = 0,
               pairs_licence: str | None = None, named_user_share: float = 0.0,
               ) -> tuple[list[PositivePair], dict[str, list[str]] | None]:
    """The positives to mine from and each group's candidate passages (None when the only source is
    a pairs file), from every source given. Records in ``provenance`` what was read: ``sources``
    (name, SPDX licence, file name and sha256, the items used, positives), the union of items as
    ``training_conversations`` (LoCoMo conversations and LongMemEval question ids: what the
    benchmarks refuse to grade the model on) and the held-out items. ``named_user_share`` of the
    LongMemEval questions are rendered under a first name (:mod:`bench.training.named_user`).

    Raises:
        TrainingDataError: on a malformed pairs file, unknown conversations or impossible folds.
        DatasetError: if ``data`` is not a LoCoMo file or a ``longmemeval`` file not LongMemEval.
    """
    positives: list[PositivePair] = []
    corpora: dict[str, list[str]] = {}
    sources: list[dict[str, object]] = []
    trained: list[str] = []
    if data is not None:
        got, got_corpora, record = locomo_source(data, conversations, fold, provenance)
        positives += got
        corpora.update(got_corpora)
        sources.append(record)
        trained += record["items"]  # type: ignore[arg-type]
    if longmemeval:
        got, got_corpora, records = longmemeval_sources(longmemeval, question_fold, fold_seed, provenance,
                                                     named_user_share=named_user_share)
        positives += got
        _merge_corpora(corpora, got_corpora)  # S and oracle hold the same question: one corpus
        sources += records
        trained += [q for r in records for q in r["items"]]  # type: ignore[attr-defined]
    if pairs is not None:
        from bench.training.jsonl_pairs import read_pairs_jsonl

        rows = read_pairs_jsonl(pairs)
        positives += rows
        digest = file_sha256(pairs)
        provenance.update(pairs_file=pairs.name, pairs_sha256=digest)
        sources.append({"name": f"pairs file {pairs.name}", "licence": pairs_licence or "unknown",
                        "file": pairs.name, "sha256": digest, "item_kind": "pairs",
                        "n_items": len(rows), "n_positives": len(rows)})
    provenance["sources"] = sources
    if trained:  # a pairs file names no conversation (train_cross_encoder records an empty list then)
        provenance["training_conversations"] = sorted(set(trained))
    provenance["positive_sources"] = " + ".join(f"{r['name']} ({r['licence']})" for r in sources)
    return positives, (corpora or None)


def locomo_source(data: Path, conversations: list[str] | None, fold: tuple[int, int] | None,
                   provenance: dict[str, object]) -> tuple[list[PositivePair], dict[str, list[str]], dict[str, object]]:
    """LoCoMo positives (observations and QA evidence of categories 1-4), corpora and source record."""
    from bench.common.datasets import load_locomo
    from bench.training import pairs as training_pairs
    from workers.runtime.model_licences import DATASET_LICENCES

    convs = load_locomo(data)
    all_ids = sorted(c.conversation_id for c in convs)
    if fold is not None:
        chosen, held_out = training_pairs.fold_conversations(all_ids, *fold)
        provenance["fold"] = f"{fold[0]}/{fold[1]}"
    else:
        chosen = conversations or []
        held_out = [c for c in all_ids if c not in chosen]
    positives = training_pairs.locomo_positives(convs, chosen)
    corpora = {c.conversation_id: list(training_pairs.turn_passages(c).values())
               for c in convs if c.conversation_id in chosen}
    digest = file_sha256(data)
    provenance.update(
        data="LoCoMo (Maharana et al., ACL 2024), CC BY-NC 4.0",
        data_file=data.name,
        data_sha256=digest,
        held_out_conversations=held_out,
    )
    record: dict[str, object] = {
        "name": "LoCoMo", "licence": DATASET_LICENCES["LoCoMo"], "file": data.name, "sha256": digest,
        "item_kind": "conversations", "items": list(chosen), "held_out": held_out,
        "n_positives": len(positives), "positives": "observations + QA evidence (categories 1-4)",
    }
    return positives, corpora, record


def longmemeval_sources(files: Sequence[Path], question_fold: tuple[int, int] | None, seed: int,
                         provenance: dict[str, object], *, named_user_share: float = 0.0,
                         ) -> tuple[list[PositivePair], dict[str, list[str]], list[dict[str, object]]]:
    """LongMemEval positives (question, ``has_answer`` turn) with their haystacks as corpora, one
    source record per file. With ``question_fold`` the questions of all files are split together
    (:func:`bench.training.pairs.question_folds` over the union of ids, stratified by type, seeded),
    so a question held out of one file is held out of every file. A ``named_user_share`` of the
    questions, drawn by ``seed`` (:func:`bench.training.named_user.assign_names`), is rendered
    under a first name; the record counts them as ``named_user_questions``."""
    from bench.common.datasets import load_longmemeval
    from bench.training import pairs as training_pairs
    from bench.training.named_user import assign_names
    from workers.runtime.model_licences import DATASET_LICENCES

    loaded = [(path, load_longmemeval(path)) for path in files]
    types: dict[str, str | None] = {}
    for _, convs in loaded:
        for c in convs:
            types.setdefault(c.conversation_id, c.questions[0].question_type if c.questions else None)
    held_out: set[str] = set()
    if question_fold is not None:
        fold, n_folds = question_fold
        if not 1 <= fold <= n_folds:
            from bench.training.errors import TrainingDataError

            raise TrainingDataError("question-fold", f"fold {fold}/{n_folds} impossible")
        held_out = set(training_pairs.question_folds(sorted(types.items()), n_folds, seed)[fold - 1])
        provenance.update(question_fold=f"{fold}/{n_folds}", question_fold_seed=seed,
                          held_out_questions=sorted(held_out))
    positives: list[PositivePair] = []
    corpora: dict[str, list[str]] = {}
    records: list[dict[str, object]] = []
    for path, convs in loaded:
        chosen = [c.conversation_id for c in convs if c.conversation_id not in held_out]
        names = assign_names(chosen, named_user_share, seed,
                             {c.conversation_id: " ".join(q.text for q in c.questions) for c in convs}
                             ) if named_user_share else {}
        got, got_corpora = training_pairs.longmemeval_positives(convs, chosen, user_names=names)
        positives += got
        _merge_corpora(corpora, got_corpora)
        used = sorted({p.group for p in got})
        records.append({
            "name": "LongMemEval", "licence": DATASET_LICENCES["LongMemEval"], "file": path.name,
            "sha256": file_sha256(path), "item_kind": "questions", "items": used,
            "n_positives": len(got), "positives": "question -> has_answer turn (abstention and evidence-less "
                                                  "questions skipped)",
            "named_user_share": named_user_share, "named_user_questions": len(set(names) & set(used)),
        })
    return positives, corpora, records


def _merge_corpora(into: dict[str, list[str]], more: dict[str, list[str]]) -> None:
    """Add ``more``'s passages to ``into``'s group by group, each distinct passage once, in order."""
    for group, passages in more.items():
        into[group] = list(dict.fromkeys([*into.get(group, []), *passages]))


def file_sha256(path: Path) -> str:

    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
