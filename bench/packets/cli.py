"""The ``mnemos bench packets`` command: load the data, the bi-encoder and the reranker folds, run
:func:`bench.packets.run.run_packets_bench`, write ``packets.{json,md,png}`` (docs/architecture.md
"Evidence packets")."""

from __future__ import annotations

import logging
import shlex
import sys
from pathlib import Path

import click

from bench.common.caches import DEFAULT_CACHE_DIR
from bench.common.folds import load_folds, parse_fold_spec
from mnemos.packets import TokenCounter, whitespace_tokens

logger = logging.getLogger(__name__)


def tokenizer_counter(model_dir: Path) -> TokenCounter:
    """Tokens of a text under the ``tokenizer.json`` of a cross-encoder directory (no special tokens,
    no truncation): what the service's ``CrossEncoderReranker.count_tokens`` counts."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)


@click.command("packets")
@click.option("--locomo", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="LoCoMo JSON: evidence recall per tenant.")
@click.option("--longmemeval", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="LongMemEval JSON: its knowledge-update questions.")
@click.option("--reranker-fold", "folds", multiple=True, metavar="DIR[=CONV,...]", required=True,
              help="Cross-encoder fold (repeatable); each question is reranked by the fold held out from it.")
@click.option("--budgets", default="256,512,1024", show_default=True, help="Comma-separated token budgets.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="At most N conversations per data set.")
@click.option("--out-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("bench/results"),
              show_default=True)
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_CACHE_DIR,
              show_default=True)
@click.option("--resamples", type=click.IntRange(min=100), default=10_000, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--max-length", type=click.IntRange(min=8), default=128, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True)
def packets(locomo: Path | None, longmemeval: Path | None, folds: tuple[str, ...], budgets: str, limit: int | None,
            out_dir: Path, cache_dir: Path, resamples: int, seed: int, max_length: int, batch_size: int) -> None:
    """Evidence packets against the top-k list at equal token budgets (LoCoMo recall, LongMemEval updates)."""
    from bench.common.caches import cached_bi_encoder
    from bench.common.datasets import load_locomo, load_longmemeval
    from bench.packets.run import PacketBenchOptions, run_packets_bench, write_outputs
    from mnemos.encoder import bundled_bi_encoder_path

    if locomo is None and longmemeval is None:
        raise click.UsageError("give --locomo and/or --longmemeval")
    sizes = tuple(int(b) for b in budgets.split(",") if b.strip())
    router, _ = load_folds(list(folds), cache_dir=cache_dir, max_length=max_length, batch_size=batch_size)
    assert router is not None
    first_model = parse_fold_spec(folds[0])[0]
    count: TokenCounter = (tokenizer_counter(first_model) if (first_model / "tokenizer.json").is_file()
                           else whitespace_tokens)
    encoder = cached_bi_encoder(bundled_bi_encoder_path(), cache_dir / "embeddings")
    loco = load_locomo(locomo)[:limit] if locomo is not None else []
    lme = load_longmemeval(longmemeval)[:limit] if longmemeval is not None else []
    document = run_packets_bench(loco, lme, encoder, router.for_conversation, count,
                                 PacketBenchOptions(budgets=sizes, resamples=resamples, seed=seed))
    document = {"command": "mnemos " + " ".join(shlex.quote(a) for a in sys.argv[1:]), **document}
    for path in write_outputs(document, out_dir):
        click.echo(f"wrote {path}")
