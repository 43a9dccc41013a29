"""Running the user's code safely: a warm worker with torch imported forks one child per call.

Server side: `torch_skills.runner.pool.WorkerPool` (no torch). Worker side: `zygote` (the warm
process), `child` (what each forked child runs), `usercode` (building the user's model,
inputs and loss), `codeimport` (resolving, checking and importing a code reference: one import
path for every tool) and `proctree` (finding and killing every descendant of a job). Tool logic runs inside the child as `def run(request, job) -> Result`.
"""
