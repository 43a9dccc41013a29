"""profile_model: measure a real training or inference step, then say what bounds it and what to read next.

Use it through the MCP tool `profile_model`, or in the worker as `torch_skills.profiling.worker:run`.
`models.py` (schemas), `peaks.py`, `stats.py`, `categories.py`, `classify.py` and `findings.py`
import no torch; `step.py`, `timing.py`, `calibrate.py`, `probe.py`, `trace.py`, `compiled.py` and
`worker.py` run only in the worker.
"""
