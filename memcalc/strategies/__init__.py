"""Which lever to pull when a job does not fit: traced and derived strategies, ranked.

Each strategy is one registered rule (``memcalc.strategies.rules``). The planner traces
through an injected ``VariantEstimator``; ``memcalc.api.plan_spec`` supplies the pipeline's.
"""

from memcalc.strategies.plan import plan_strategies
from memcalc.strategies.report import Candidate, StrategyPlan
from memcalc.strategies.specs import ClusterSpec, Interconnect, Strategy
from memcalc.strategies.variants import VariantEstimator

__all__ = ["Candidate", "ClusterSpec", "Interconnect", "Strategy", "StrategyPlan",
           "VariantEstimator", "plan_strategies"]
