"""check_gradients: where NaN/Inf come from, which parameters get no or bad gradients, gradcheck.

The server imports only `torch_skills.gradients.models` (request and result schemas, no torch). The
worker runs `torch_skills.gradients.worker:run`, which uses `probe` (hooks on one forward/backward),
`localize` (op- and autograd-node-level search, run only when something is wrong),
`analysis` (per-parameter and per-layer statistics), `findings` (facts to advice) and
`gradcheck` (numerical vs analytical Jacobians of a custom function).
"""
