"""Request and engine statistics, and the loggers that publish them.

Upstream counterpart: ``vllm/v1/metrics/``. ``stats.py`` holds what is measured (per
request, per step); ``loggers.py`` turns it into a log line or Prometheus metrics.
"""
