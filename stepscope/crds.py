"""`make crds`: write the chart's CRDs (helm/stepscope/crds/, which crds/ links to) from
stepscope.contracts, so that the schema the API server checks, `kubectl explain` and the parts'
parser read one description of each field. tests/crd/test_generated.py fails when the files are
stale."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from stepscope.contracts.openapi import CRDS

HEADER = "# Generated from stepscope/contracts by `make crds`: edit the contracts, not this file.\n"


def render(name: str) -> str:
    return HEADER + yaml.safe_dump(CRDS[name](), sort_keys=False, width=120, allow_unicode=True)


def main(argv: list[str] | None = None) -> int:
    folder = Path(argv[0] if argv else sys.argv[1] if len(sys.argv) > 1 else "helm/stepscope/crds")
    for name in CRDS:
        (folder / name).write_text(render(name))
        print(f"wrote {folder / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
