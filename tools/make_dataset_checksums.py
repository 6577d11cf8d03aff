"""Regenerate refbayes/datasets/checksums.json from a staged data folder's SHA256SUMS.

Usage: python tools/make_dataset_checksums.py /path/to/staged/data

The output maps each file path (relative to the data folder) to [sha256, size in bytes], one file
per line, sorted by path, so a diff of the table shows exactly which files changed. Only checksums
and sizes are recorded; no data content.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

__all__ = ["read_sha256sums", "render", "main"]

OUTPUT = Path(__file__).resolve().parents[1] / "refbayes" / "datasets" / "checksums.json"


def read_sha256sums(root: Path) -> dict[str, tuple[str, int]]:
    """Parse ``sha256sum`` output (``<hex>  <path>``) and stat each file for its size."""
    table = {}
    for lineno, line in enumerate((root / "SHA256SUMS").read_text().splitlines(), start=1):
        if not line.strip():
            continue
        digest, sep, rel = line.partition("  ")
        if not sep or len(digest) != 64:
            raise ValueError(f"SHA256SUMS line {lineno}: expected '<sha256>  <path>', got {line!r}")
        table[rel] = (digest, (root / rel).stat().st_size)
    return table


def render(table: dict[str, tuple[str, int]]) -> str:
    # One entry per line keeps the file reviewable and its diffs minimal.
    rows = [f"  {json.dumps(rel)}: [{json.dumps(d)}, {n}]" for rel, (d, n) in sorted(table.items())]
    return "{\n" + ",\n".join(rows) + "\n}\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    OUTPUT.write_text(render(read_sha256sums(Path(argv[0]))))
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
