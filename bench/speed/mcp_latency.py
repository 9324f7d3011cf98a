"""``mnemos bench mcp``: recall latency through ``mnemos mcp`` (stdio) against the rq path, same questions.

The ingest and query workers run as processes with the service's models (``bench speed``'s settings:
suppression off, no deep pass) and, so that neither path answers from the other's work, no rerank or
packet cache. LoCoMo conversations are published turn by turn (one tenant each); then every question
is asked twice at ``k`` = 10: once through :meth:`api.client.MnemosClient.retrieve` (enqueue, wait
for the result) and once as the ``recall`` tool of an ``mnemos mcp --tenant <conversation>`` process
driven by the MCP SDK's stdio client, in alternating order (the rq path first on even questions),
after a few warm-up calls of each. Times are wall seconds in this process around each call. The
result is the p50 of each path and their difference, against the bar (MCP's p50 at most 20 ms above the
rq path's), with the median of the per-question differences beside it.
"""

from __future__ import annotations

import asyncio
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import click
from tqdm import tqdm

from bench.common.harness import (
    bench_settings,
    evaluated_conversations,
    machine,
    percentile,
    publish_conversations,
    run_stamp,
    running_service,
    write_json,
)
from workers.settings import Settings, child_environment

P50_BAR_S = 0.020
WARM_UP = 3


async def _measure(run: Any, questions: list[Any], settings: Settings) -> dict[str, list[float]]:
    from mcp.client import Client
    from mcp.client.stdio import StdioServerParameters

    times: dict[str, list[float]] = {"rq": [], "mcp": [], "diff": []}
    by_tenant: dict[str, list[Any]] = {}
    for question in questions:
        by_tenant.setdefault(question.conversation_id, []).append(question)
    progress = tqdm(total=len(questions), desc="recall: rq and MCP", unit="q", disable=None)
    for tenant, asked in by_tenant.items():
        command = [sys.executable, "-m", "workers", "--log-level", "WARNING", "mcp", "--tenant", tenant]
        params = StdioServerParameters(command=command[0], args=command[1:],
                                       env=child_environment(settings.replace(metrics_enabled=False)))
        async with Client(params, read_timeout_seconds=120) as client:
            await _measure_tenant(run.client, client, tenant, [q.text for q in asked], times, progress)
    progress.close()
    return times


async def _measure_tenant(rq_client: Any, mcp_client: Any, tenant: str, texts: list[str],
                          times: dict[str, list[float]], progress: Any) -> None:
    """Ask each of ``texts`` through both paths, alternating which goes first, after a warm-up."""

    def rq(text: str) -> float:
        started = time.perf_counter()
        rq_client.retrieve(tenant, text, k=10)
        return time.perf_counter() - started

    async def mcp(text: str) -> float:
        started = time.perf_counter()
        result = await mcp_client.call_tool("recall", {"query": text, "k": 10})
        elapsed = time.perf_counter() - started
        if result.is_error:
            raise click.ClickException(f"recall through MCP failed: {result.content}")
        return elapsed

    for text in texts[:WARM_UP]:
        rq(text)
        await mcp(text)
    for number, text in enumerate(texts):
        if number % 2 == 0:
            rq_s = rq(text)
            mcp_s = await mcp(text)
        else:
            mcp_s = await mcp(text)
            rq_s = rq(text)
        times["rq"].append(rq_s)
        times["mcp"].append(mcp_s)
        times["diff"].append(mcp_s - rq_s)
        progress.update(1)


def run_mcp_bench(settings: Settings, *, data: Path, reranker: str | None, limit: int | None,
                  limit_conversations: int | None, json_path: Path | None) -> int:
    """Run the comparison (module docstring) and print it; writes JSON to ``json_path`` when given."""
    from bench.common.questions import prepare_questions

    stamp = run_stamp()
    run_settings = bench_settings(settings, reranker=reranker, stamp=stamp).replace(rerank_cache_pairs=0,
                                                                                    packet_cache_size=0)
    conversations, _trained = evaluated_conversations(data, reranker, limit_conversations, True)
    questions = prepare_questions(conversations, limit=limit)
    with running_service(run_settings, ("ingest", "query")) as run:
        ingest = publish_conversations(run, conversations)
        times = asyncio.run(_measure(run, questions, run_settings))
    rq_p50, mcp_p50 = percentile(times["rq"], 50), percentile(times["mcp"], 50)
    payload = {
        "command": " ".join(shlex.quote(a) for a in ["mnemos", *sys.argv[1:]]),
        "machine": machine(), "data": data.name, "reranker": run_settings.cross_encoder,
        "bi_encoder": run_settings.bi_encoder, "conversations": [c.conversation_id for c in conversations],
        "n_turns": sum(len(c.turns) for c in conversations), "n_questions": len(questions), "k": 10,
        "ingest_turns_per_s": ingest["ingest_turns_per_s"],
        "rq_p50_s": rq_p50, "rq_p95_s": percentile(times["rq"], 95),
        "mcp_p50_s": mcp_p50, "mcp_p95_s": percentile(times["mcp"], 95),
        "p50_difference_s": mcp_p50 - rq_p50, "paired_difference_p50_s": percentile(times["diff"], 50),
        "bar_s": P50_BAR_S, "within_bar": mcp_p50 - rq_p50 <= P50_BAR_S,
        "settings": {"suppression": run_settings.suppression, "deep_threshold": run_settings.deep_threshold,
                     "rerank_cache_pairs": run_settings.rerank_cache_pairs,
                     "packet_cache_size": run_settings.packet_cache_size},
    }
    for key in ("n_questions", "rq_p50_s", "rq_p95_s", "mcp_p50_s", "mcp_p95_s", "p50_difference_s",
                "paired_difference_p50_s", "within_bar"):
        click.echo(f"{key}: {payload[key]}")
    if json_path is not None:
        write_json(json_path, payload)
        click.echo(f"wrote {json_path}")
    return 0 if payload["within_bar"] else 1


@click.command("mcp")
@click.option("--data", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True,
              help="LoCoMo JSON (locomo10.json)")
@click.option("--reranker", default=None, help="cross-encoder dir ('fake' for plumbing); default: settings")
@click.option("--limit", type=int, default=None, help="about this many questions")
@click.option("--conversations", "limit_conversations", type=int, default=None, help="first N conversations only")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="write the results here (e.g. bench/results/mcp_latency.json)")
@click.pass_context
def mcp_latency(ctx: click.Context, data: Path, reranker: str | None, limit: int | None,
                limit_conversations: int | None, json_path: Path | None) -> None:
    """Recall p50 through the MCP server (stdio) against the rq path on the same questions (exit 1 when
    MCP's p50 is more than 20 ms above the rq path's)."""
    settings: Settings = ctx.find_root().obj
    sys.exit(run_mcp_bench(settings, data=data, reranker=reranker or settings.cross_encoder, limit=limit,
                           limit_conversations=limit_conversations, json_path=json_path))
