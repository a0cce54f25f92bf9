"""How findings are worded (ranks, amounts, kernel and function names), so every message reads
the same way."""
from __future__ import annotations

import re


def ranks_text(ranks: list[int], limit: int = 8) -> str:
    """'rank 3', 'ranks 1, 4 and 6', 'ranks 0-7', 'ranks 0-3, 9, 12-15 and 40 more'."""
    ranks = sorted(set(ranks))
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    runs: list[str] = []
    start = prev = ranks[0]
    for r in ranks[1:] + [None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    shown, rest = runs[:limit], len(runs) - limit
    if rest > 0:
        return "ranks " + ", ".join(shown) + f" and {rest} more"
    return "ranks " + (", ".join(shown[:-1]) + " and " + shown[-1] if len(shown) > 1 else shown[0])


def ms(us: float) -> str:
    """Microseconds as a short human figure in milliseconds."""
    value = us / 1000.0
    return f"{value:.0f} ms" if value >= 100 else f"{value:.1f} ms" if value >= 1 else f"{value:.2f} ms"


_KINETO_FUNCTION = re.compile(r"^(?P<file>.*)\((?P<line>\d+)\): (?P<func>.*)$")
# Python's reprs of C functions, as with_stack records them: '<built-in method wait of
# pybind11_builtins.pybind11_detail_function_record_v1_... object at 0x7f...>', '<built-in function
# linear>', "<method 'sum' of 'torch._C.TensorBase' objects>".
_BUILTIN = re.compile(r"^<built-in (?:method|function) (?P<func>\S+?)(?: of (?P<owner>.+?) object)?(?: at 0x[0-9a-fA-F]+)?>$")
_METHOD = re.compile(r"^<method '(?P<func>[^']+)' of '(?P<owner>[^']+)' objects>$")


def function_text(name: str) -> str:
    """Kineto's 'path/train.py(42): augment' as 'augment (train.py:42)'; a C function's repr as
    'run_backward (built-in, torch._C._EngineBase)', without the object's address or the
    pybind11 record type that names nothing a user wrote; other names unchanged."""
    m = _KINETO_FUNCTION.match(name)
    if m:
        return f"{m['func']} ({m['file'].replace(chr(92), '/').rsplit('/', 1)[-1]}:{m['line']})"
    m = _BUILTIN.match(name) or _METHOD.match(name)
    if not m:
        return name
    owner = m["owner"] or ""
    if not owner or owner == "type" or owner.startswith("pybind11"):
        return f"{m['func']} (built-in)"
    return f"{m['func']} (built-in, {owner})"


def short(name: str, limit: int = 60) -> str:
    """Kernel names run to hundreds of characters of template arguments and parameter lists:
    keep the name itself ('void at::native::f<...>(...)' reads 'at::native::f')."""
    base = name.removeprefix("void ")
    cut = min((i for i in (base.find("<"), base.find("(")) if i > 0), default=len(base))
    base = base[:cut].strip()
    return base if len(base) <= limit else base[: limit - 3] + "..."

