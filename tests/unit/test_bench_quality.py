"""The quality benchmark end to end on a tiny synthetic dataset, with fake encoder and reranker."""

from __future__ import annotations

import json

import faiss
import pytest

from bench.common.caches import PersistentEncoder, PersistentReranker
from bench.common.corpora import CorpusMode
from bench.common.folds import parse_fold_spec
from bench.common.plot import plot_ndcg
from bench.quality.arms import ARM_NAMES, arm_by_name
from bench.quality.engine import Engine, FoldRerankers, Protocol, RerankerFold, RunKey, prepare_questions
from bench.quality.run import QualityOptions, run_quality
from bench.quality.selection import SUPPRESSION_OFF, select_full
from bench.quality.variants import Variant
from mnemos.encoder import HashingEncoder
from mnemos.rendering import Rendering
from mnemos.rerank import CachedReranker, FakeReranker
from tests.unit.test_bench_synthetic import synthetic_conversations

faiss.omp_set_num_threads(1)  # single-query searches: OpenMP start-up dominates otherwise


def _rerankers() -> FoldRerankers:
    folds = [RerankerFold("fold-a", "fake-a", frozenset({"conv-1"})), RerankerFold("fold-b", "fake-b", frozenset({"conv-2"}))]
    return FoldRerankers(folds, {f.name: CachedReranker(FakeReranker(), max_entries=None) for f in folds})


@pytest.fixture(scope="module")
def report():
    options = QualityOptions(burnin_factor=2.0, n_resamples=200)
    return run_quality(synthetic_conversations(), encoder=HashingEncoder(64), rerankers=_rerankers(), options=options,
                       dataset={"name": "synthetic", "path": "-"})


def _engine(modes=(CorpusMode.PER_TENANT, CorpusMode.POOLED)) -> Engine:
    convs = synthetic_conversations()
    return Engine(conversations=convs, questions=prepare_questions(convs), encoder=HashingEncoder(64),
                  rerankers=_rerankers(), modes=modes, burnin_factor=2.0)


def test_fold_selection_never_uses_a_model_trained_on_the_conversation() -> None:
    router = _rerankers()
    assert router.fold_for("conv-1").name == "fold-b"
    assert router.fold_for("conv-2").name == "fold-a"
    assert router.fold_for("conv-9").name == "fold-a"
    only = FoldRerankers([RerankerFold("x", "x", frozenset({"conv-1"}))], {"x": FakeReranker()})
    with pytest.raises(LookupError):
        only.fold_for("conv-1")


def test_questions_split_in_halves_per_conversation_and_limit_spreads() -> None:
    questions = prepare_questions(synthetic_conversations(), seed=0)
    for conv in ("conv-1", "conv-2"):
        mine = [q for q in questions if q.conversation_id == conv]
        assert sum(q.half == 0 for q in mine) == len(mine) // 2
        assert sum(q.dev for q in mine) == len(mine) // 2
    assert [q.half for q in questions] == [q.half for q in prepare_questions(synthetic_conversations(), seed=0)]
    limited = prepare_questions(synthetic_conversations(), limit=10)
    assert len(limited) == 10 and {q.conversation_id for q in limited} == {"conv-1", "conv-2"}


@pytest.mark.parametrize("mode", [CorpusMode.PER_TENANT, CorpusMode.POOLED])
def test_heldout_never_evaluates_a_question_with_state_it_touched(mode: CorpusMode) -> None:
    engine = _engine((mode,))
    arm = arm_by_name("+clustered_rif_gap")
    results = engine.run_suppressed(mode, Protocol.HELDOUT, arm)
    records = engine.states[RunKey(mode, Protocol.HELDOUT, arm.name)]
    evaluated = [k for r in records for k in r.evaluated]
    assert sorted(evaluated) == sorted(q.key for q in engine.questions)  # each question exactly once
    assert set(results) == set(evaluated)
    for record in records:
        assert record.burn_keys and not (record.burn_keys & record.evaluated)
        assert record.bootstrapped and record.suppressed > 0
        assert 0 < record.entries_touched <= record.tenant_entries
    transductive = engine.run_suppressed(mode, Protocol.TRANSDUCTIVE, arm)
    assert set(transductive) == set(evaluated)
    for record in engine.states[RunKey(mode, Protocol.TRANSDUCTIVE, arm.name)]:
        assert record.burn_keys <= record.evaluated


def test_cluster_count_follows_the_seed_ratio() -> None:
    engine = _engine((CorpusMode.PER_TENANT,))
    assert engine.cluster_count(arm_by_name("+global_rif"), 500) == 1
    assert engine.cluster_count(arm_by_name("+clustered_rif_gap"), 500) == 29
    assert engine.cluster_count(arm_by_name("+clustered_rif_gap"), 1986) == 30
    assert engine.cluster_count(arm_by_name("+clustered_rif_gap"), 100) == 5
    assert engine.cluster_count(arm_by_name("+clustered_rif_gap"), 20) == 2


def test_json_has_the_schema_and_every_run(report) -> None:
    doc = json.loads(json.dumps(report.document))
    assert {"dataset", "reranker", "runs", "settings", "cost", "mnemos_full"} <= set(doc)
    runs = doc["runs"]
    assert len(runs) == len(ARM_NAMES) * 2 * 2
    assert {(r["corpus"], r["protocol"], r["arm"]) for r in runs} == {
        (c, p, a) for c in ("per_tenant", "pooled") for p in ("heldout", "transductive") for a in ARM_NAMES
    }
    for run in runs:
        for key in ("n_questions", "ndcg@10", "ndcg@10_ci95", "recall@10", "recall@10_ci95", "recall@30",
                    "recall@30_ci95", "p_vs_hybrid_rerank", "exact_episode", "wrong_family", "sibling_confusion",
                    "categories"):
            assert key in run, key
        assert set(run["categories"]) == {"1", "2", "3", "4", "5"}
    assert doc["cost"]["reranker_pairs"] > 0
    full = doc["mnemos_full"]
    assert {"features", "steps", "test_split", "without_suppression", "dev_questions"} <= set(full)
    post_rerank = [f for f in full["features"] if f not in ("deep_pass", SUPPRESSION_OFF)]
    assert len(full["without_suppression"]) == (2 if post_rerank and full["suppression"] else 0)
    for item in full["without_suppression"]:
        assert 0.0 <= item["ndcg@10"] <= 1.0 and "vs hybrid_rerank (test_split)" in item


def test_the_service_defaults_are_scored_on_the_held_out_gap_pools(report) -> None:
    from workers.query.config import feature_settings
    from workers.settings import Settings

    entries = report.document["service_defaults"]
    runs = {(r["corpus"], r["protocol"], r["arm"]): r for r in report.document["runs"]}
    assert [e["corpus"] for e in entries] == ["per_tenant", "pooled"]
    labels = [s.label() for s in feature_settings(Settings())]
    assert labels and all(e["features"] == labels for e in entries)
    for entry in entries:
        gap = runs[(entry["corpus"], "heldout", "+clustered_rif_gap")]
        vs_gap = entry["vs +clustered_rif_gap (heldout) (all)"]
        # the paired difference is the features' alone: the same pools, the same questions
        assert vs_gap["n"] == entry["n"] == gap["n_questions"]
        assert entry["ndcg@10"] - vs_gap["delta_ndcg@10"] == pytest.approx(gap["ndcg@10"])
        assert {"vs mnemos_full (heldout) (test_split)", "vs bm25 (heldout) (all)"} <= set(entry)
    assert "Service defaults (pooled)" in report.markdown
    per_question = report.per_question["pooled/heldout/service_defaults"]
    gap = report.per_question["pooled/heldout/+clustered_rif_gap"]
    assert per_question.keys() == gap.keys()
    # the features reorder the same 30-turn pool: Recall@30 is the gap arm's, question by question
    assert all(per_question[k][2] == pytest.approx(gap[k][2]) for k in gap)


def test_service_defaults_rank_the_held_out_gap_pools_with_the_worker_settings() -> None:
    from types import SimpleNamespace

    from bench.quality.document import SERVICE_DEFAULTS, service_defaults_json
    from bench.quality.engine import QuestionMetrics
    from workers.query.config import feature_settings
    from workers.settings import Settings

    keys = [f"q{i}" for i in range(8)]
    pools = {(m, p, a): {k: object() for k in keys} for m in (CorpusMode.PER_TENANT, CorpusMode.POOLED)
             for p in (Protocol.HELDOUT, Protocol.TRANSDUCTIVE) for a in ("+clustered_rif_gap", "hybrid_rerank")}
    calls = []

    def metrics_of(value: float) -> dict:
        return {k: QuestionMetrics(value, value, value, 0.0, 0.0, 0.0, None, False) for k in keys}

    class Recorder:
        seconds: dict = {}

        def evaluate(self, mode, results, *, reranked, settings, abstain_threshold):
            calls.append((mode, results, tuple(settings), reranked))
            right = results is pools[(mode, Protocol.HELDOUT, "+clustered_rif_gap")]
            return metrics_of(0.9 if right else 0.1)

    metrics = {(m, Protocol.HELDOUT, a): metrics_of(0.5) for m in (CorpusMode.PER_TENANT, CorpusMode.POOLED)
               for a in ("mnemos_full", "bm25")}
    by_key = {k: SimpleNamespace(category=1, dev=i % 2 == 0) for i, k in enumerate(keys)}
    entries, per_question = service_defaults_json(Recorder(), QualityOptions(n_resamples=100), pools, metrics,
                                                  by_key, feature_settings(Settings()))
    assert [c[0] for c in calls] == [CorpusMode.PER_TENANT, CorpusMode.POOLED]
    assert all(c[2] == feature_settings(Settings()) and c[3] for c in calls)
    assert [e["ndcg@10"] for e in entries] == pytest.approx([0.9, 0.9])
    assert entries[0]["vs bm25 (heldout) (all)"]["delta_ndcg@10"] == pytest.approx(0.4)
    assert entries[0]["vs bm25 (heldout) (test_split)"]["n"] == 4
    assert set(per_question) == {(m, Protocol.HELDOUT, SERVICE_DEFAULTS) for m in (CorpusMode.PER_TENANT, CorpusMode.POOLED)}


def test_numbers_are_sane(report) -> None:
    runs = {(r["corpus"], r["protocol"], r["arm"]): r for r in report.document["runs"]}
    for run in runs.values():
        assert run["n_questions"] == 72  # 88 labelled, 16 of them category 5
        for key in ("ndcg@10", "recall@10", "recall@30", "exact_episode", "wrong_family", "sibling_confusion"):
            assert 0.0 <= run[key] <= 1.0
        lo, hi = run["ndcg@10_ci95"]
        assert lo <= run["ndcg@10"] <= hi
        assert run["exact_episode"] + run["wrong_family"] + run["sibling_confusion"] == pytest.approx(1.0)
        assert run["recall@10"] <= run["recall@30"] + 1e-12
    for corpus in ("per_tenant", "pooled"):
        base = runs[(corpus, "heldout", "hybrid_rerank")]
        assert base["p_vs_hybrid_rerank"] == 1.0
        assert base["ndcg@10"] > 0.5
        # stateless arms are identical under both protocols
        assert runs[(corpus, "transductive", "bm25")]["ndcg@10"] == runs[(corpus, "heldout", "bm25")]["ndcg@10"]
        assert runs[(corpus, "heldout", "+clustered_rif_gap")]["suppression_state"]["all_bootstrapped"]


def test_markdown_and_plot(report, tmp_path) -> None:
    assert "| hybrid_rerank |" in report.markdown and "## pooled · heldout" in report.markdown
    out = plot_ndcg(report.document["runs"], tmp_path / "p.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_persistent_caches_answer_reruns_without_loading_models(tmp_path) -> None:
    fake = FakeReranker()
    first = PersistentReranker("m1", tmp_path / "scores", lambda: fake)
    scores = first.score("q", ["a q", "b"])
    assert first.model_pairs_scored == 2

    def refuse():
        raise AssertionError("model loaded although every pair was cached")

    second = PersistentReranker("m1", tmp_path / "scores", refuse)
    assert second.score("q", ["b", "a q"]).tolist() == [scores[1], scores[0]]
    other = PersistentReranker("m2", tmp_path / "scores", lambda: FakeReranker(fn=lambda q, t: 9.0))
    assert other.score("q", ["b"]).tolist() == [9.0]  # another model never reads m1's scores

    enc = PersistentEncoder("e", 64, tmp_path / "embeddings", lambda: HashingEncoder(64))
    vectors = enc.encode(["x y", "z", "x y"])
    again = PersistentEncoder("e", 64, tmp_path / "embeddings", refuse).encode(["z", "x y"])
    assert (again == vectors[[1, 0]]).all() and enc.encoded == 2
    assert PersistentEncoder("e", 64, tmp_path / "embeddings", refuse).encode([]).shape == (0, 64)


def test_parse_fold_spec() -> None:
    assert parse_fold_spec("/m/a") == (parse_fold_spec("/m/a")[0], None)
    path, convs = parse_fold_spec("/m/a=conv-1, conv-2")
    assert str(path) == "/m/a" and convs == ["conv-1", "conv-2"]


def test_prewarm_scores_every_unsuppressed_pool_once() -> None:
    engine = _engine()
    baseline = arm_by_name("hybrid_rerank")
    requested = engine.prewarm([baseline.config, arm_by_name("dense_rerank").config])
    counters = list(engine.rerankers.rerankers.values())
    scored = sum(r.pairs_scored for r in counters)
    assert requested >= scored > 0  # repeated question texts share pairs
    for mode in engine.modes:
        engine.run_plain(mode, baseline)
        engine.run_plain(mode, arm_by_name("dense_rerank"))
    assert sum(r.pairs_scored for r in counters) == scored  # every later pool read the cache


class _ScoredEngine:
    """Stands in for Engine in select_full: a 'result' is {key: NDCG@10} already."""

    def __init__(self, n: int) -> None:
        from types import SimpleNamespace

        self.questions = [SimpleNamespace(key=f"q{i}", dev=True, labelled=True, category=1) for i in range(n)]

    def evaluate(self, mode, results, *, reranked, settings, keys):
        from types import SimpleNamespace

        return {k: SimpleNamespace(ndcg10=results[k]) for k in keys}


@pytest.mark.parametrize(("plain_gain", "dropped"), [(0.2, True), (-0.2, False), (0.0, False)])
def test_selection_drops_suppression_only_when_the_dev_split_says_so(plain_gain: float, dropped: bool) -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    engine = _ScoredEngine(60)
    modes = (CorpusMode.PER_TENANT, CorpusMode.POOLED)
    gap = {m: {q.key: float(v) for q, v in zip(engine.questions, rng.uniform(0.2, 0.6, 60), strict=True)}
           for m in modes}
    plain = {m: {k: v + plain_gain for k, v in gap[m].items()} for m in modes}
    selection = select_full(engine, gap, None, plain, grid={}, n_resamples=200)
    assert selection.suppression is (not dropped)
    assert [s.candidate for s in selection.steps] == [SUPPRESSION_OFF]
    assert (SUPPRESSION_OFF in selection.labels) is dropped
    assert selection.steps[0].per_mode["pooled"]["delta"] == pytest.approx(plain_gain)


def test_variants_are_measured_against_the_main_run() -> None:
    """A variant that changes nothing matches the main run exactly (Δ 0); rendering off changes the
    first stage; suppression off gives mnemos_full's features on hybrid_rerank pools; a reranker
    variant is timed on real pools."""
    options = QualityOptions(arms=("hybrid_rrf", "hybrid_rerank", "+clustered_rif_gap", "mnemos_full"),
                             protocols=(Protocol.HELDOUT,), burnin_factor=2.0, n_resamples=200)
    variants = [
        Variant("same", "changes nothing", {}, rerankers=_rerankers(), timing=FakeReranker),
        Variant("rendering_off", "text alone", {"rendering": Rendering.TEXT}),
        Variant("suppression_off", "no suppression", {}, suppression=False),
    ]
    report = run_quality(synthetic_conversations(), encoder=HashingEncoder(64), rerankers=_rerankers(),
                         options=options, dataset={"name": "synthetic", "path": "-"}, variants=variants)
    blocks = {b["name"]: b for b in report.document["variants"]}
    for mode in ("per_tenant", "pooled"):
        for arm in ("hybrid_rrf", "hybrid_rerank", "mnemos_full"):
            same = blocks["same"]["modes"][mode][arm]
            assert same["vs_main"]["delta"] == 0.0 and same["vs_main"]["n"] == same["n"] > 0
        rendering = blocks["rendering_off"]["modes"][mode]["hybrid_rrf"]
        assert rendering["n"] > 0 and "vs_main" in rendering
        off = blocks["suppression_off"]["modes"][mode]
        assert off["mnemos_full"]["vs_main"]["n"] > 0
    assert blocks["same"]["rerank_time"]["pools"] > 0 and blocks["same"]["rerank_time"]["p50_ms"] >= 0
    assert "rerank_time" not in blocks["rendering_off"]
    assert "Variants (held-out protocol" in report.markdown


def test_variants_run_on_their_own_corpus_modes_only() -> None:
    """--variant-corpus per_tenant: the main run keeps both modes, every variant reports per_tenant
    alone (an engine-changing one builds only that mode), and a mode outside the run is refused."""
    options = QualityOptions(arms=("hybrid_rrf", "hybrid_rerank", "mnemos_full"), protocols=(Protocol.HELDOUT,),
                             burnin_factor=2.0, n_resamples=200, variant_modes=(CorpusMode.PER_TENANT,))
    variants = [Variant("same", "changes nothing", {}, rerankers=_rerankers()),
                Variant("suppression_off", "no suppression", {}, suppression=False)]
    report = run_quality(synthetic_conversations(), encoder=HashingEncoder(64), rerankers=_rerankers(),
                         options=options, dataset={"name": "synthetic", "path": "-"}, variants=variants)
    assert {r["corpus"] for r in report.document["runs"]} == {"per_tenant", "pooled"}
    for block in report.document["variants"]:
        assert list(block["modes"]) == ["per_tenant"]
        assert block["modes"]["per_tenant"]["hybrid_rerank"]["vs_main"]["n"] > 0
    with pytest.raises(ValueError, match="variant corpus modes"):
        QualityOptions(modes=(CorpusMode.POOLED,), variant_modes=(CorpusMode.PER_TENANT,))


def test_a_variant_reports_no_mnemos_full_when_the_main_run_selected_none() -> None:
    """Without the mnemos_full arm there is no feature selection, so a variant's "mnemos_full" would
    be +clustered_rif_gap under another name: it is left out (its reranker and first stage stay)."""
    options = QualityOptions(arms=("hybrid_rrf", "hybrid_rerank"), protocols=(Protocol.HELDOUT,),
                             modes=(CorpusMode.PER_TENANT,), burnin_factor=2.0, n_resamples=200)
    report = run_quality(synthetic_conversations(), encoder=HashingEncoder(64), rerankers=_rerankers(), options=options,
                         dataset={"name": "synthetic", "path": "-"},
                         variants=[Variant("same", "changes nothing", {}, rerankers=_rerankers())])
    (block,) = report.document["variants"]
    assert set(block["modes"]["per_tenant"]) == {"hybrid_rrf", "hybrid_rerank"}
    assert block["modes"]["per_tenant"]["hybrid_rerank"]["vs_main"]["delta"] == 0.0


def test_the_fusion_convex_variant_fuses_only_the_reranking_arms_at_the_chosen_weight() -> None:
    """fusion_convex: the reranking arms' pools come from convex fusion at hybrid_convex's dev-split
    weight (recorded in the block), the first stage hybrid_rrf stays RRF (Δ 0), and a run without
    hybrid_convex, which gives the weight, is refused before any work."""
    from mnemos.fusion import Fusion

    options = QualityOptions(arms=("hybrid_rrf", "hybrid_convex", "hybrid_rerank", "+clustered_rif_gap", "mnemos_full"),
                             protocols=(Protocol.HELDOUT,), modes=(CorpusMode.POOLED,), burnin_factor=2.0,
                             n_resamples=200)
    variant = Variant("fusion_convex", "convex", {}, fusion=Fusion.CONVEX)
    report = run_quality(synthetic_conversations(), encoder=HashingEncoder(64), rerankers=_rerankers(),
                         options=options, dataset={"name": "synthetic", "path": "-"}, variants=[variant])
    (block,) = report.document["variants"]
    assert block["fusion"] == {"fusion": "convex", "weight": report.document["fusion"]["weight"]}
    arms = block["modes"]["pooled"]
    assert arms["hybrid_rrf"]["vs_main"]["delta"] == 0.0
    assert arms["hybrid_rerank"]["vs_main"]["delta"] != 0.0  # the variant's reranking arms ran on other pools
    assert set(arms) == {"hybrid_rrf", "hybrid_rerank", "mnemos_full"}

    engine = _engine(modes=(CorpusMode.POOLED,))
    convex = Engine(conversations=engine.conversations, questions=engine.questions, encoder=HashingEncoder(64),
                    rerankers=_rerankers(), modes=(CorpusMode.POOLED,), burnin_factor=2.0,
                    reranked_fusion=(Fusion.CONVEX, 0.9))
    rerank, rrf = arm_by_name("hybrid_rerank"), arm_by_name("hybrid_rrf")
    plain, fused = engine.run_plain(CorpusMode.POOLED, rerank), convex.run_plain(CorpusMode.POOLED, rerank)
    assert any(set(plain[k].entry_ids) != set(fused[k].entry_ids) for k in plain)  # other pools were reranked
    assert convex.run_plain(CorpusMode.POOLED, rrf) == engine.run_plain(CorpusMode.POOLED, rrf)
    gap = arm_by_name("+clustered_rif_gap")  # burn-in and frozen evaluation fuse as asked too
    suppressed = engine.run_suppressed(CorpusMode.POOLED, Protocol.HELDOUT, gap)
    convex_suppressed = convex.run_suppressed(CorpusMode.POOLED, Protocol.HELDOUT, gap)
    assert any(set(suppressed[k].entry_ids) != set(convex_suppressed[k].entry_ids) for k in suppressed)

    with pytest.raises(ValueError, match="reranking arms"):
        run_quality(synthetic_conversations(), encoder=HashingEncoder(64), rerankers=None,
                    options=QualityOptions(arms=("hybrid_rrf", "hybrid_convex"), protocols=(Protocol.HELDOUT,)),
                    dataset={"name": "synthetic", "path": "-"}, variants=[variant])
    with pytest.raises(ValueError, match="hybrid_convex"):
        run_quality(synthetic_conversations(), encoder=HashingEncoder(64), rerankers=_rerankers(),
                    options=QualityOptions(arms=("hybrid_rrf", "hybrid_rerank"), protocols=(Protocol.HELDOUT,)),
                    dataset={"name": "synthetic", "path": "-"}, variants=[variant])


def test_the_service_defaults_follow_the_settings_passed_and_name_the_variables() -> None:
    from workers.settings import Settings

    service = Settings.from_env({"MNEMOS_BM25_WEIGHT": "0", "MNEMOS_BM25_SCORE_WEIGHT": "0.5",
                                 "MNEMOS_REDIS_URL": "redis://127.0.0.1:6379/0"})
    run = run_quality(synthetic_conversations(), encoder=HashingEncoder(64), rerankers=_rerankers(),
                      options=QualityOptions(burnin_factor=2.0, n_resamples=50, arms=("hybrid_rerank", "+clustered_rif_gap")),
                      dataset={"name": "synthetic", "path": "-"}, service_settings=service)
    assert run.document["service_environment"] == ["MNEMOS_BM25_SCORE_WEIGHT", "MNEMOS_BM25_WEIGHT"]
    features = run.document["service_defaults"][0]["features"]
    assert "bm25_score(floor=1,weight=0.5)" in features  # the default evidence floor, 1 logit
    assert not any(f.startswith("bm25(") for f in features)
    assert "Service defaults (settings from MNEMOS_BM25_SCORE_WEIGHT, MNEMOS_BM25_WEIGHT)" in run.markdown


def test_the_default_report_names_no_variable(report) -> None:
    assert report.document["service_environment"] == []
    assert any(f.startswith("bm25_score(") for f in report.document["service_defaults"][0]["features"])


def test_feature_fields_are_exactly_what_feature_settings_reads() -> None:
    from dataclasses import fields

    from workers.query.config import FEATURE_FIELDS, feature_settings
    from workers.runtime.errors import SettingsError
    from workers.settings import Settings

    base = Settings()
    for f in fields(Settings):
        if f.name == "from_environment" or not isinstance(getattr(base, f.name), int | float) \
                or isinstance(getattr(base, f.name), bool):
            continue
        try:
            changed = base.replace(**{f.name: getattr(base, f.name) + 2})
        except SettingsError:  # a value the settings refuse (shard 2 of 1) is no feature weight
            assert f.name not in FEATURE_FIELDS
            continue
        assert (feature_settings(changed) != feature_settings(base)) == (f.name in FEATURE_FIELDS), f.name
