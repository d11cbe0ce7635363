"""Write the GPU feature table of docs/fast-engine.md from :mod:`hf_rstitch.fast.capabilities` (its one home).

    PYTHONPATH=$PWD python tools/capability_table.py           # rewrites the block between the markers
    PYTHONPATH=$PWD python tools/capability_table.py --check   # exit 1 when the doc differs (tests run this check)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hf_rstitch.fast import capabilities

DOC = Path(__file__).resolve().parents[1] / "docs" / "fast-engine.md"
BEGIN, END = "<!-- capabilities table: tools/capability_table.py -->", "<!-- end of capabilities table -->"


def rendered(text: str) -> str:
    """``text`` with the block between :data:`BEGIN` and :data:`END` replaced by the table."""
    if BEGIN not in text or END not in text:
        raise ValueError(f"{DOC} has no block between {BEGIN!r} and {END!r}; add both markers where the table goes")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{capabilities.markdown()}\n{END}{tail}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 when the doc is stale")
    args = parser.parse_args(argv)
    text = DOC.read_text()
    new = rendered(text)
    if args.check:
        if new != text:
            print(f"{DOC} is stale: run PYTHONPATH=$PWD python tools/capability_table.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
