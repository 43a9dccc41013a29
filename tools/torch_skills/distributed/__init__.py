"""check_distributed: run the user's training step on real gloo/nccl ranks and say what breaks at scale.

`models` (request/result, no torch), `worker` (the job child: forks the ranks and supervises them),
`rank` (what one rank runs), `comms` (the collective recorder), `compare` (cross-rank analysis),
`findings` (findings with their fixes).
"""
