"""The `torch-skills` command: serve over stdio or HTTP, validate the skills, or run the demo.

Use it as:
    torch-skills                                  # stdio, for Claude Code / Desktop / Cursor / VS Code / Codex
    torch-skills --transport http --port 8765     # streamable HTTP on 127.0.0.1 (prints URL and token)
    torch-skills --check                          # validate the skills and exit
    torch-skills --demo                           # call every tool on the bundled example and print results
(`python server.py ...` in a clone, `python -m torch_skills ...` anywhere it is installed.)

Only argparse is imported before the arguments are read, so `--help` answers at once; the MCP
SDK and the server load after that.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="torch-skills",
        description="PyTorch engineering skills and diagnostic tools over MCP (stdio by default).",
    )
    p.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    p.add_argument("--host", default="127.0.0.1", help="HTTP bind address (default: loopback only)")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument(
        "--token",
        default=None,
        help="HTTP bearer token clients must send (default: $TORCH_SKILLS_TOKEN, else a random one made at "
        "start, printed with the URL and written to a file only you can read); required beyond loopback",
    )
    p.add_argument(
        "--allowed-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a browser origin allowed to call the HTTP server, e.g. https://app.example.com (repeatable)",
    )
    p.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="HOST",
        help="a Host header value the HTTP server answers to besides loopback and the bound host (repeatable)",
    )
    p.add_argument(
        "--allow", action="append", default=[], metavar="DIR", help="another folder the tools may read"
    )
    p.add_argument("--skills-dir", type=Path, default=None, help="serve skills from this folder instead")
    p.add_argument(
        "--max-jobs", type=int, default=max(1, min(2, os.cpu_count() or 1)), help="concurrent tool runs"
    )
    p.add_argument("--memory-limit-gib", type=float, default=None, help="default RAM cap per tool run")
    p.add_argument(
        "--python",
        default=None,
        metavar="PATH",
        help="interpreter (or environment folder) the user's code runs under; default: VIRTUAL_ENV, "
        "a .venv/venv in the working directory or an --allow folder, CONDA_PREFIX, else this one",
    )
    p.add_argument(
        "--no-prewarm", action="store_true", help="start the torch worker on the first call instead"
    )
    p.add_argument("--check", action="store_true", help="validate the skills and exit (non-zero on problems)")
    p.add_argument(
        "--demo", action="store_true", help="run every tool on the bundled example and print results"
    )
    p.add_argument("--version", action="store_true", help="print the version and exit")
    p.add_argument("--log-level", default="WARNING")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr)
    from torch_skills.skillpack.loader import DEFAULT_SKILLS_DIR

    skills_dir = args.skills_dir or DEFAULT_SKILLS_DIR
    if args.version:
        from torch_skills import __version__

        sys.stdout.write(f"torch-skills {__version__}\n")
        return 0
    if args.check:
        from torch_skills.skillpack.validate import validate_pack

        report = validate_pack(skills_dir)
        sys.stdout.write(report.render() + "\n")
        return 0 if report.ok else 1
    if args.demo:
        from torch_skills.examples.demo import run_demo

        return run_demo()
    http_settings = None
    if args.transport == "http":
        from torch_skills.http_app import HttpConfigError, HttpSettings

        try:
            http_settings = HttpSettings.from_args(
                args.host, args.port, args.token, args.allowed_origin, args.allowed_host
            )
        except HttpConfigError as e:
            sys.stderr.write(f"torch-skills: {e}\n")
            return 2
    from torch_skills.roots import RootTooBroad
    from torch_skills.runner.interpreter import InterpreterError
    from torch_skills.server import build_server

    try:
        server = build_server(
            skills_dir,
            allow=[Path(a) for a in args.allow],
            max_jobs=args.max_jobs,
            prewarm=not args.no_prewarm,
            memory_limit_gib=args.memory_limit_gib,
            python=args.python,
        )
    except (InterpreterError, RootTooBroad) as e:
        sys.stderr.write(f"torch-skills: {e}\n")
        return 2
    if http_settings is not None:
        from torch_skills.http_app import HttpConfigError, serve_http

        try:
            serve_http(server, http_settings)
        except HttpConfigError as e:  # e.g. no folder to write a generated token to
            sys.stderr.write(f"torch-skills: {e}\n")
            return 2
    else:
        import anyio

        from torch_skills.stdio_transport import serve_stdio

        anyio.run(serve_stdio, server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
