"""Which lever to pull when a job does not fit: traced and derived strategies, ranked."""

from memcalc.strategies.plan import plan_strategies
from memcalc.strategies.report import Candidate, StrategyPlan
from memcalc.strategies.specs import ClusterSpec, Interconnect, Strategy

__all__ = ["Candidate", "ClusterSpec", "Interconnect", "Strategy", "StrategyPlan",
           "plan_strategies"]
