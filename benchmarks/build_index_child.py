"""The child-process entry of ``benchmarks.build_index``: ``python -m
benchmarks.build_index_child KIND CONFIG_JSON`` runs one measurement in a fresh process and
prints its result as one ``RESULT <json>`` line (other lines are progress).

Why fresh processes: every build's peak memory and imports must be its own, and every build a
build, not a cache hit.
"""

from __future__ import annotations

import json
import sys

from benchmarks.build_index_access import child_access
from benchmarks.build_index_blend_rows import child_blend_first, child_blend_rows
from benchmarks.build_index_builds import child_compare, child_floor, child_megatron, child_ours
from benchmarks.harness.token_corpus import generate_token_corpus

__all__ = ["CHILDREN"]

CHILDREN = {"generate": generate_token_corpus, "ours": child_ours, "megatron": child_megatron,
            "floor": child_floor, "compare": child_compare, "access": child_access,
            "blend_rows": child_blend_rows, "blend_first": child_blend_first}


def main(argv: list[str] | None = None) -> int:
    kind, config = sys.argv[1:] if argv is None else argv
    result = CHILDREN[kind](json.loads(config))
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
