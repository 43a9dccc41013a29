"""verify_checkpoint: is a checkpoint safe to load, complete for resuming, and does it fit a model?

The server wires `worker.run` (called in the sandboxed worker child). Modules, in the order a call
uses them: `scan` (static, torch-free: `pickle_scan`, `zip_scan`, `safetensors_format`,
`dcp_format`, with `allowlist`), `load` (opens only what the scan called safe), `contents`
(tensors, NaN/Inf), `resume` (completeness, optimizer consistency), `fit` (keys against a model),
`report` (findings, summary); schemas in `models`.
"""
