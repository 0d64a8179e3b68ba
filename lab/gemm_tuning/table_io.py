"""Writing ``w12_kernels/gemm/tuned.json``: the one function that writes it (``write_table``),
the merges that decide what a tuning step changes, and the file's layout (one line per
entry).

A step measures on the GPU it runs on and writes into one section: by default the section of
the GPU's architecture and multiprocessor count (``sm90-132``), with ``--section exact`` the
section of its memory class too (``sm90-132-140gib``: entries only that GPU reads, over the
others; see ``w12_kernels.gemm.table``).
"""

from __future__ import annotations

import json

from w12_kernels.gemm import table

ABOUT = ("W12 GEMM launch configurations per GPU; read by w12_kernels/gemm/table.py, "
         "written by lab/tune_gemm.py only")


def _leaf(v) -> bool:
    return not isinstance(v, dict) or all(not isinstance(x, dict) for x in v.values())


def format_table(obj, indent: int = 0) -> str:
    """JSON with one line per entry: dicts of scalars (and lists) inline, others expanded."""
    if _leaf(obj):
        return json.dumps(obj, separators=(", ", ": "))
    pad = " " * (indent + 1)
    items = [f"{pad}{json.dumps(k)}: {format_table(v, indent + 1)}" for k, v in obj.items()]
    return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"


def section_key(which: str = "base", key: table.GpuKey | None = None) -> str:
    """The section a step writes: this GPU's ``base`` (architecture and multiprocessors) or
    ``exact`` (and its memory class) key."""
    key = key or table.gpu_key()
    if key is None:
        raise SystemExit("tune_gemm: needs a CUDA GPU (the section is the GPU's)")
    if which not in ("base", "exact"):
        raise SystemExit(f"tune_gemm: --section is base or exact, not {which!r}")
    return key.section if which == "base" else key.exact


def read_section(name: str) -> dict:
    """The section ``name`` of the file as it is ({} where there is none)."""
    if not table.TUNED_PATH.exists():
        return {}
    return json.loads(table.TUNED_PATH.read_text())["sections"].get(name, {})


def write_table(name: str, part: str, value: dict, gpu: str | None = None) -> dict:
    """Put ``value`` as the ``part`` ("small_m" or "large") of section ``name`` of tuned.json,
    every other section and part as they were; ``gpu`` joins the section's ``measured_on``.
    The one place the file is written. Returns the section written."""
    if part not in ("small_m", "large"):
        raise ValueError(f"write_table: part is small_m or large, not {part!r}")
    doc = (json.loads(table.TUNED_PATH.read_text()) if table.TUNED_PATH.exists()
           else {"about": ABOUT, "sections": {}})
    sections = doc["sections"]
    section = dict(sections.get(name, {}))
    if gpu is not None and gpu not in section.get("measured_on", []):
        section["measured_on"] = [*section.get("measured_on", []), gpu]
    section[part] = value
    sections[name] = {key: section[key] for key in ("measured_on", "small_m", "large")
                      if key in section}
    table.TUNED_PATH.write_text(format_table({**doc, "sections": sections}) + "\n")
    table.load.cache_clear()
    table._small_rule.cache_clear()
    table._large_rule.cache_clear()
    return sections[name]


def merge_small(current: dict, swept: dict) -> dict:
    """The small-M part after a sweep of some shapes: their entries replace the current ones;
    the rule for unlisted shapes, its default layouts and the other shapes' entries stay,
    since a handful of shapes says nothing about the rest."""
    return {**current, "shapes": {**current.get("shapes", {}), **swept.get("shapes", {})}}


def overlay_shapes(base: dict, over: dict) -> dict:
    """Large-M ``shapes`` ({"NxK": {"M": entry}}) with ``over``'s entries replacing ``base``'s
    per shape and M class; a shape's other classes stay (new dicts; neither input changes)."""
    shapes = {shape: dict(by_m) for shape, by_m in base.items()}
    for shape, by_m in over.items():
        shapes[shape] = {**shapes.get(shape, {}), **by_m}
    return shapes


def merge_large(current: dict, swept: dict, keep_default: bool = True) -> dict:
    """The large-M part after a sweep: the swept (shape, M) entries replace the current ones;
    every other entry stays, the other M classes of a swept shape too, and ``max_m`` is the
    larger of the two where the section has one. The default (and a first ``max_m``) comes
    from the sweep only where ``keep_default`` is False (a sweep of every shape and candidate):
    a sweep of a few shapes or candidates says little about the others, and a memory
    section, which has neither, keeps reading its base section's."""
    out = {**current, "shapes": overlay_shapes(current.get("shapes", {}),
                                               swept.get("shapes", {}))}
    if "max_m" in current or not keep_default:
        out["max_m"] = max(current.get("max_m", 0), swept.get("max_m", 0))
    if not keep_default:
        out["default"] = swept["default"]
    return out
