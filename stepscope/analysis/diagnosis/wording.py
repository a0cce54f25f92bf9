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
_BUILTIN = re.compile(
    r"^<built-in (?:method|function) (?P<func>\S+?)(?: of (?P<owner>.+?) object)?(?: at 0x[0-9a-fA-F]+)?>$"
)
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


_ANONYMOUS = "(anonymous namespace)::"
_LITERAL = re.compile(r"^(?:true|false|-?[\d.]+[a-z]*|\(.*\)-?[\d.]+[a-z]*)$")


def _template_args(text: str) -> list[str]:
    """The top-level arguments of the template argument list `text` opens with ('<...>...')."""
    args: list[str] = []
    depth, start = 0, 1
    for i, c in enumerate(text):
        if c in "<([":
            depth += 1
        elif c in ">)]":
            depth -= 1
            if depth == 0:
                return [*args, text[start:i].strip()]
        elif c == "," and depth == 1:
            args.append(text[start:i].strip())
            start = i + 1
    return args


def short(name: str, limit: int = 60) -> str:
    """Kernel names run to hundreds of characters of template arguments and parameter lists: keep
    the name itself and its first type argument, which says what a generic kernel runs
    ('void cutlass::device_kernel<flash::FlashAttnBwd<...>>(...)' reads
    'cutlass::device_kernel<flash::FlashAttnBwd>'), never a bare namespace."""
    base, rest = _name_itself(name)
    arg = next((a for a in _template_args(rest) if not _LITERAL.match(a)), "") if rest[:1] == "<" else ""
    if arg:
        # Outer namespaces go first where the whole does not fit, the argument before the name.
        arg_parts, parts = _name_itself(arg)[0].split("::"), base.split("::")
        forms = [
            f"{'::'.join(parts[-k:])}<{'::'.join(arg_parts[-j:])}>"
            for k, j in ((len(parts), 2), (2, 2), (2, 1), (1, 1))
        ]
        base = next((f for f in forms if len(f) <= limit), forms[-1])
    return base if len(base) <= limit else base[: limit - 3] + "..."


def _name_itself(name: str) -> tuple[str, str]:
    """A C++ name without 'void ' and anonymous namespaces, cut before its template or parameter
    list, and that list with what follows."""
    base = name.removeprefix("void ").replace(_ANONYMOUS, "")
    cut = min((i for i in (base.find("<"), base.find("(")) if i > 0), default=len(base))
    return base[:cut].strip(), base[cut:]
