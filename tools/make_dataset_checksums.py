"""Regenerate refbayes/datasets/checksums.json from a staged data folder's checksum lists.

The lists are ``SHA256SUMS`` (the data sets staged first) and, where present,
``SHA256SUMS.images`` (full MNIST, Fashion-MNIST and CIFAR-10, staged later); both are
``sha256sum`` output with paths relative to the folder, and a path may appear in only one.

Usage: python tools/make_dataset_checksums.py /path/to/staged/data

The output maps each file path (relative to the data folder) to [sha256, size in bytes], one file
per line, sorted by path, so a diff of the table shows exactly which files changed. Only checksums
and sizes are recorded; no data content.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

__all__ = ["LISTS", "read_sha256sums", "read_all", "render", "main"]

OUTPUT = Path(__file__).resolve().parents[1] / "refbayes" / "datasets" / "checksums.json"


LISTS = ("SHA256SUMS", "SHA256SUMS.images")  # the second is optional


def read_sha256sums(root: Path, name: str = "SHA256SUMS") -> dict[str, tuple[str, int]]:
    """Parse ``sha256sum`` output (``<hex>  <path>``) in ``root / name`` and stat each file."""
    table = {}
    for lineno, line in enumerate((root / name).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        digest, sep, rel = line.partition("  ")
        if not sep or len(digest) != 64:
            raise ValueError(f"{name} line {lineno}: expected '<sha256>  <path>', got {line!r}")
        table[rel] = (digest, (root / rel).stat().st_size)
    return table


def read_all(root: Path) -> dict[str, tuple[str, int]]:
    """Every list of ``LISTS`` present under ``root`` (``SHA256SUMS`` is required), merged;
    ValueError if a path is listed twice."""
    table = read_sha256sums(root, LISTS[0])
    for name in LISTS[1:]:
        if not (root / name).is_file():
            continue
        more = read_sha256sums(root, name)
        twice = sorted(set(table) & set(more))
        if twice:
            raise ValueError(f"{name}: {twice} are also listed in another checksum list")
        table.update(more)
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
    OUTPUT.write_text(render(read_all(Path(argv[0]))))
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
