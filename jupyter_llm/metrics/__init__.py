"""Prometheus metrics, in jupyter_server's default registry (its ``/metrics``)
and in ``jupyter llm serve``'s own ``/metrics``: counters and histograms that
the generation path and the scheduler bump (``instruments``), and gauges read
from the scheduler at scrape time (``collector``)."""

from jupyter_llm.metrics.collector import watch
from jupyter_llm.metrics.instruments import Asked, Completion, count_request, labels

__all__ = ["Asked", "Completion", "count_request", "labels", "watch"]
