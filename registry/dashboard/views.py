"""What each dashboard page shows, assembled from the registry service (no HTML here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from registry import entities as e
from registry.access import Principal, visible_workers
from registry.costs import Cost, serving_cost
from registry.placements import CANDIDATE_CHANGES
from registry.service import Registry

# Lineage trees are small in practice; the cap keeps a pathological DAG from drawing forever.
MAX_TREE_DEPTH = 8


@dataclass(frozen=True)
class Standing:
    """One row of a task's leaderboard: a candidate, its latest eval run and the rule's verdict."""

    candidate: e.Candidate
    run: e.EvalRun | None
    check: e.PromotionCheck | None  # None for the champion
    is_champion: bool
    cost: Cost | None = None  # serving cost per million items, from the run
    stale: bool = False  # an endpoint model that no longer answers its probe as registered

    @property
    def score(self) -> float | None:
        return self.run.main_score if self.run else None

    @property
    def ci(self) -> tuple[float, float] | None:
        return self.run.ci.get(self.run.main_metric) if self.run else None

    @property
    def items_per_s(self) -> float | None:
        return self.run.cost.get("items_per_s") if self.run else None

    @property
    def other_metrics(self) -> list[tuple[str, float]]:
        """The run's metrics besides the main one (each kind has its own)."""
        if self.run is None:
            return []
        return [(k, v) for k, v in self.run.metrics.items() if k != self.run.main_metric]

    @property
    def can_be_placed(self) -> bool:
        return self.candidate.base_model is not None


@dataclass(frozen=True)
class TaskSummary:
    task: e.Task
    champion: e.Candidate | None
    champion_run: e.EvalRun | None
    candidates: int
    placement: e.PlacementStatus | None


@dataclass(frozen=True)
class TaskPage:
    task: e.Task
    suite: e.Suite
    champion: e.Candidate | None
    standings: list[Standing]
    history: list[e.Promotion]
    placement: e.PlacementStatus | None
    recommendation: e.Recommendation | None = None

    @property
    def champion_stale(self) -> bool:
        return any(s.is_champion and s.stale for s in self.standings)

    @property
    def last_change(self) -> e.Promotion | None:
        """The newest row that changed the champion (not a pinned/replicas change)."""
        return next((p for p in self.history if p.kind in CANDIDATE_CHANGES), None)

    @property
    def can_roll_back(self) -> bool:
        return self.last_change is not None and self.last_change.previous_candidate is not None

    @property
    def placement_mismatch(self) -> bool:
        """The fleet is told to serve another candidate than the champion (a placement
        written before every placement needed a promotion)."""
        placed = self.placement.candidate if self.placement else None
        return placed is not None and placed != (self.champion.name if self.champion else None)

    @property
    def main_metric(self) -> str:
        return next((s.run.main_metric for s in self.standings if s.run), "score")


def task_summaries(reg: Registry, who: Principal) -> list[TaskSummary]:
    status = {p.task: p for p in reg.placement_status()}
    summaries = []
    for task in (t for t in reg.list_tasks() if who.allows(t.name)):
        champ = reg.champion(task.name)
        run = reg.ranking_run(task.name, champ.name) if champ else None
        summaries.append(
            TaskSummary(
                task, champ, run, len(reg.list_candidates(task.name)), status.get(task.name)
            )
        )
    return summaries


def task_page(reg: Registry, task: str) -> TaskPage:
    """Standings use only runs on the newest version of the task's suite (its test split)."""
    info = reg.get_task(task)
    champ = reg.champion(task)
    board = reg.leaderboard(task)
    models = {m.name: m for m in reg.list_models()}
    standings = []
    for cand in reg.list_candidates(task):
        is_champ = champ is not None and cand.id == champ.id
        check = None if is_champ else reg.check_promotion(task, cand.name)
        run = board.get(cand.name)
        model = models.get(cand.base_model or "")
        price = model.price_per_million if model else None
        cost = serving_cost(run.cost, endpoint_price_per_million=price) if run else None
        stale = model.stale if model else False
        standings.append(Standing(cand, run, check, is_champ, cost, stale))
    # Champion first, then the best-scoring challengers; never-evaluated candidates last.
    standings.sort(key=lambda s: (not s.is_champion, s.score is None, -(s.score or 0.0)))
    status = next((p for p in reg.placement_status() if p.task == task), None)
    suite = reg.get_suite(info.suite)
    return TaskPage(
        info, suite, champ, standings, reg.list_promotions(task), status, reg.recommend(task)
    )


# ---- lineage ------------------------------------------------------------------------------
@dataclass
class LineageNode:
    kind: str  # "base" | "adapter"
    name: str
    candidate: str | None = None  # the task's candidate for this model (+adapter), if any
    score: float | None = None
    current: bool = False  # the node of the candidate being viewed
    children: list[LineageNode] = field(default_factory=list)


def lineage_tree(reg: Registry, candidate: e.Candidate) -> LineageNode | None:
    """base -> ancestors -> adapter -> descendants, each scored on this candidate's task."""
    if candidate.base_model is None:
        return None  # a lexical baseline has no model lineage
    return _LineageBuilder(reg, candidate).build()


class _LineageBuilder:
    def __init__(self, reg: Registry, candidate: e.Candidate) -> None:
        self.reg = reg
        self.candidate = candidate
        self.base = candidate.base_model or ""
        self.scores = _scores_by_pairing(reg, candidate.task)

    def build(self) -> LineageNode:
        root = self.node("base", self.base, None)
        if self.candidate.adapter is None:
            # A plain base model: show the adapters trained directly on it.
            top = [a for a in self.reg.list_adapters(self.base) if a.parent is None]
            root.children = [self.descendants(a.name, 1) for a in top]
            return root
        tip = root
        chain = self.reg.lineage(self.candidate.adapter)
        for ancestor in chain[:-1]:
            child = self.node("adapter", ancestor.name, ancestor.name)
            tip.children.append(child)
            tip = child
        tip.children.append(self.descendants(chain[-1].name, len(chain)))
        return root

    def node(self, kind: str, name: str, adapter: str | None) -> LineageNode:
        cand, score = self.scores.get((self.base, adapter), (None, None))
        return LineageNode(kind, name, cand, score, current=adapter == self.candidate.adapter)

    def descendants(self, adapter: str, depth: int) -> LineageNode:
        here = self.node("adapter", adapter, adapter)
        if depth < MAX_TREE_DEPTH:
            here.children = [
                self.descendants(c.name, depth + 1) for c in self.reg.children(adapter)
            ]
        return here


def _scores_by_pairing(
    reg: Registry, task: str
) -> dict[tuple[str, str | None], tuple[str, float | None]]:
    found: dict[tuple[str, str | None], tuple[str, float | None]] = {}
    board = reg.leaderboard(task)
    for cand in reg.list_candidates(task):
        if cand.base_model is None:
            continue
        run = board.get(cand.name)
        found[(cand.base_model, cand.adapter)] = (cand.name, run.main_score if run else None)
    return found


# ---- fleet --------------------------------------------------------------------------------
@dataclass(frozen=True)
class WorkerView:
    worker: e.Worker
    age_s: float  # since the watcher last recorded a heartbeat of it
    recent: bool

    @property
    def memory_fraction(self) -> float:
        budget = self.worker.memory_budget
        return min(1.0, self.worker.memory_used / budget) if budget else 0.0


@dataclass(frozen=True)
class FleetPage:
    workers: list[WorkerView]
    placements: list[e.PlacementStatus]
    stale_after_s: float
    now: datetime
    profiles: list[e.RuntimeProfile] = field(default_factory=list)  # `taskfleet tune`'s

    @property
    def unreachable(self) -> bool:
        """No recent heartbeat from any worker: NATS, the watcher or every worker is down."""
        return not any(w.recent for w in self.workers)

    @property
    def last_heartbeat_age_s(self) -> float | None:
        """Age of the newest heartbeat of any worker (reachable or not)."""
        return min((w.age_s for w in self.workers), default=None)

    def queue_depth(self, task: str) -> int:
        return sum(w.worker.queue_depth.get(task, 0) for w in self.workers if w.recent)

    @property
    def tasks(self) -> list[str]:
        """Every task the fleet has heard of: placed, or queued on some worker."""
        names = {p.task for p in self.placements}
        for w in self.workers:
            names.update(w.worker.queue_depth)
        return sorted(names)


def fleet_page(
    reg: Registry, who: Principal, *, stale_after_s: float, now: datetime | None = None
) -> FleetPage:
    now = now or datetime.now(UTC)
    views = []
    for worker in visible_workers(reg.list_workers(), who):
        age = (now - worker.seen_at).total_seconds()
        views.append(WorkerView(worker, age, worker.reachable and age <= stale_after_s))
    placements = [p for p in reg.placement_status() if who.allows(p.task)]
    # A task-scoped key sees the profiles tuned on its own tasks' traffic.
    profiles = [p for p in reg.list_profiles() if who.allows(p.task)]
    return FleetPage(views, placements, stale_after_s, now, profiles)


# ---- suites -------------------------------------------------------------------------------
# Suites are shared by every task; a task-scoped key sees only its own tasks beside them.
@dataclass(frozen=True)
class SuiteRow:
    suite: e.Suite  # newest version
    versions: int
    tasks: list[str]


def suites_page(reg: Registry, who: Principal) -> list[SuiteRow]:
    tasks = [t for t in reg.list_tasks() if who.allows(t.name)]
    return [
        SuiteRow(s, s.version, [t.name for t in tasks if t.suite == s.name])
        for s in reg.list_suites()
    ]


@dataclass(frozen=True)
class SuitePage:
    versions: list[e.Suite]  # newest first
    tasks: list[e.Task]

    @property
    def newest(self) -> e.Suite:
        return self.versions[0]


def suite_page(reg: Registry, who: Principal, name: str) -> SuitePage:
    versions = reg.suite_versions(name)
    tasks = [t for t in reg.list_tasks() if t.suite == name and who.allows(t.name)]
    return SuitePage(versions, tasks)
