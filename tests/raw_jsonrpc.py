"""Hand-written JSON-RPC messages for tests that talk to a real server process without an SDK client.

Use `INITIALIZE` as the first message (it asks for protocol 2025-06-18 with no client capabilities).
"""

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"},
    },
}
