"""Renders the Helm chart's templates for tests where no `helm` binary is installed.

A small interpreter of the part of Go's text/template (and Helm's functions) the chart uses:
`{{- ... -}}` trimming, comments, `define`/`include`, `if`/`else`/`end`, `range` (rebinding `.`),
`with`, pipelines, and the functions in FUNCTIONS. It is NOT Helm: no `lookup` (answers nothing,
as `helm template` does), no `tpl`, no variables other than `$`, no `else if`. A template that uses
something else raises `Unsupported` instead of rendering something wrong."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[1] / "helm" / "stepscope"
_ACTION = re.compile(r"\{\{(-?)\s*(.*?)\s*(-?)\}\}", re.S)


class Unsupported(Exception):
    pass


class Failed(Exception):
    """A template's `fail` or `required`: what `helm install` would refuse with."""


def _yaml(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=False, sort_keys=True).rstrip("\n") if value not in (None, {}, []) else ("{}" if value == {} else "[]" if value == [] else "null")


def _truthy(value: Any) -> bool:
    return value not in (None, False, 0, "", [], {})


FUNCTIONS: dict[str, Any] = {
    "quote": lambda v: json.dumps("" if v is None else str(v)),
    "toYaml": _yaml,
    "nindent": lambda n, s: "\n" + "\n".join(" " * int(n) + line if line else line for line in str(s).split("\n")),
    "indent": lambda n, s: "\n".join(" " * int(n) + line if line else line for line in str(s).split("\n")),
    "default": lambda d, v=None: v if _truthy(v) else d,
    "trunc": lambda n, s: str(s)[:int(n)],
    "trimSuffix": lambda suffix, s: str(s)[:-len(suffix)] if suffix and str(s).endswith(suffix) else str(s),
    "printf": lambda fmt, *args: fmt % args,
    "join": lambda sep, items: sep.join(str(i) for i in items or []),
    "has": lambda item, items: item in (items or []),
    "not": lambda v: not _truthy(v),
    "and": lambda *vs: all(_truthy(v) for v in vs),
    "or": lambda *vs: next((v for v in vs if _truthy(v)), vs[-1]),
    "eq": lambda a, *bs: any(a == b for b in bs),
    "ne": lambda a, b: a != b,
    "gt": lambda a, b: a > b,
    "int": int,
    "list": lambda *vs: list(vs),
    "lookup": lambda *_: {},
    "fail": lambda message: (_ for _ in ()).throw(Failed(message)),
    "required": lambda message, value=None: value if _truthy(value) else (_ for _ in ()).throw(Failed(message)),
    "toJson": lambda v: json.dumps(v, separators=(",", ":")),
    "empty": lambda v: not _truthy(v),
    "len": len,
    "lower": lambda s: str(s).lower(),
    "b64enc": lambda s: __import__("base64").b64encode(str(s).encode()).decode(),
    "randAlphaNum": lambda n: "x" * int(n),
}


def _tokens(text: str) -> list[tuple[str, str]]:
    """[("text", s) | ("action", s)] with Go's trim markers applied."""
    out: list[tuple[str, str]] = []
    pos = 0
    for m in _ACTION.finditer(text):
        chunk = text[pos:m.start()]
        if m.group(1):
            chunk = chunk.rstrip()
        out.append(("text", chunk))
        out.append(("action", m.group(2)))
        pos = m.end()
        if m.group(3):
            rest = text[pos:]
            pos += len(rest) - len(rest.lstrip())
    out.append(("text", text[pos:]))
    return out


def _parse(tokens: list[tuple[str, str]], i: int, stop: tuple[str, ...]) -> tuple[list[Any], int, str]:
    """Nodes until an action in `stop` (returned with the index after it)."""
    nodes: list[Any] = []
    while i < len(tokens):
        kind, value = tokens[i]
        i += 1
        if kind == "text":
            nodes.append(("text", value))
            continue
        if value.startswith("/*"):
            continue
        word = value.split(None, 1)[0] if value else ""
        if word in stop:
            return nodes, i, word
        if word in ("if", "range", "with", "define"):
            body, i, end = _parse(tokens, i, ("else", "end"))
            other: list[Any] = []
            if end == "else":
                other, i, _ = _parse(tokens, i, ("end",))
            nodes.append((word, value[len(word):].strip(), body, other))
        elif word in ("else", "end"):
            raise Unsupported(f"unexpected {{{{ {value} }}}}")
        elif word in ("template", "block", "tpl") or value.startswith("$") and ":=" in value:
            raise Unsupported(value)
        else:
            nodes.append(("expr", value))
    return nodes, i, ""


class Renderer:
    def __init__(self, values: dict[str, Any], namespace: str = "stepscope", release: str = "stepscope", chart: Path = CHART) -> None:
        meta = yaml.safe_load((chart / "Chart.yaml").read_text())
        self.root = {"Values": values, "Release": {"Name": release, "Namespace": namespace, "Service": "Helm"},
                     "Chart": {"Name": meta["name"], "Version": meta["version"], "AppVersion": meta["appVersion"]}}
        self.defines: dict[str, list[Any]] = {}
        self.chart = chart
        for helper in (chart / "templates").glob("_*.tpl"):
            self._run(_parse(_tokens(helper.read_text()), 0, ())[0], self.root)

    def render(self, template: str) -> list[dict[str, Any]]:
        text = self._run(_parse(_tokens((self.chart / "templates" / template).read_text()), 0, ())[0], self.root)
        return [d for d in yaml.safe_load_all(text) if d]

    def _run(self, nodes: list[Any], dot: Any) -> str:
        out = []
        for node in nodes:
            kind = node[0]
            if kind == "text":
                out.append(node[1])
            elif kind == "expr":
                value = self._pipeline(node[1], dot)
                out.append("" if value is None else str(value).lower() if isinstance(value, bool) else str(value))
            elif kind == "define":
                self.defines[shlex.split(node[1])[0]] = node[2]
            elif kind == "if":
                out.append(self._run(node[2] if _truthy(self._pipeline(node[1], dot)) else node[3], dot))
            elif kind == "with":
                value = self._pipeline(node[1], dot)
                out.append(self._run(node[2], value) if _truthy(value) else self._run(node[3], dot))
            elif kind == "range":
                items = self._pipeline(node[1], dot) or []
                out.append("".join(self._run(node[2], item) for item in items) if items else self._run(node[3], dot))
        return "".join(out)

    def _pipeline(self, expr: str, dot: Any) -> Any:
        value: Any = _NOTHING
        for stage in _split(expr, "|"):
            words = _split(stage.strip(), " ")
            name, args = words[0], [self._arg(w, dot) for w in words[1:]]
            if name == "include":
                if value is not _NOTHING:
                    raise Unsupported(stage)
                value = self._run(self.defines[args[0]], args[1] if len(args) > 1 else dot)
            elif name in FUNCTIONS:
                value = FUNCTIONS[name](*args) if value is _NOTHING else FUNCTIONS[name](*args, value)
            elif value is _NOTHING and not args:
                value = self._arg(name, dot)
            else:
                raise Unsupported(stage)
        return value

    def _arg(self, word: str, dot: Any) -> Any:
        if word.startswith('"'):
            return json.loads(word)
        if re.fullmatch(r"-?\d+", word):
            return int(word)
        if word in ("true", "false"):
            return word == "true"
        if word.startswith("(") and word.endswith(")"):
            return self._pipeline(word[1:-1], dot)
        if word == ".":
            return dot
        if word.startswith("$"):
            value, path = self.root, word[1:]
        elif word.startswith("."):
            value, path = dot, word
        else:
            raise Unsupported(word)
        for part in [p for p in path.split(".") if p]:
            value = value.get(part) if isinstance(value, dict) else None
        return value


_NOTHING = object()


def _split(text: str, sep: str) -> list[str]:
    """Split on `sep` outside quotes and parentheses."""
    parts, depth, quoted, current = [], 0, False, ""
    for ch in text:
        if ch == '"' and not current.endswith("\\"):
            quoted = not quoted
        elif not quoted and ch == "(":
            depth += 1
        elif not quoted and ch == ")":
            depth -= 1
        if ch == sep and not quoted and depth == 0:
            if current.strip() or sep == "|":
                parts.append(current)
            current = ""
            continue
        current += ch
    if current.strip():
        parts.append(current)
    return [p.strip() for p in parts]


def values(**overrides: Any) -> dict[str, Any]:
    """values.yaml with `overrides` merged in (nested dicts merge)."""
    def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
        return {**base, **{k: merge(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v for k, v in extra.items()}}
    return merge(yaml.safe_load((CHART / "values.yaml").read_text()), overrides)


def render(*templates: str, namespace: str = "stepscope", **overrides: Any) -> list[dict[str, Any]]:
    renderer = Renderer(values(**overrides), namespace=namespace)
    return [doc for t in templates for doc in renderer.render(t)]
