"""The skill pack on disk: loading skills, validating them, and routing symptoms with the router.

No MCP and no torch here: `server.py` serves what `SkillPack` loads, `python server.py --check`
runs `validate`, and the `route` tool calls `route.Router`.
"""
