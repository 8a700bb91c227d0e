"""`auto`: a retrieve-or-not router in front of another pipeline (the Auto-RAG study's
conditional routing). `pipeline` holds the pipeline, its `auto` section (`AutoConfig`: what it
routes to), its trace (`RouteTrace`) and what composition builds for it; `retrieval_router` the rule
and its `router` section.
"""

from sieverag.inference.pipelines.auto.pipeline import (
    AUTO_SECTION,
    AutoConfig,
    AutoPipeline,
    RouteTrace,
    build_router,
    router_encoder,
)
from sieverag.inference.pipelines.auto.retrieval_router import (
    ROUTER_SECTION,
    RouteDecision,
    Router,
    RouterConfig,
)

__all__ = ["AUTO_SECTION", "ROUTER_SECTION", "AutoConfig", "AutoPipeline", "RouteDecision",
           "RouteTrace", "Router", "RouterConfig", "build_router", "router_encoder"]
