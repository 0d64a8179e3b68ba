"""The drafter's offline training prompts: seeded, distinct, the kinds in turn, and past the
number of functions each function's other kinds, without changing the first prompts."""

from __future__ import annotations

from engine.speculative.stdlib_prompts import stdlib_files, stdlib_prompts

DOC = "Return the thing this function computes, described in more than forty characters."


def _write(root, files: int, per_file: int) -> None:
    for f in range(files):
        body = "".join(f'def fn{f}_{i}(a, b=1):\n    """{DOC}"""\n    return a + b + {i}\n\n'
                       f'def _hidden{i}():\n    """{DOC}"""\n\n'
                       for i in range(per_file))
        (root / f"mod{f}.py").write_text(body + "def short():\n    'too short'\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_x.py").write_text(f'def skipped():\n    """{DOC}"""\n')


def test_prompts_are_seeded_distinct_and_extend_past_the_functions(tmp_path):
    _write(tmp_path, files=4, per_file=3)  # 12 public documented functions
    assert len(stdlib_files(tmp_path)) == 4
    one = stdlib_prompts(12, seed=0, root=tmp_path)
    assert one == stdlib_prompts(12, seed=0, root=tmp_path)
    assert one != stdlib_prompts(12, seed=1, root=tmp_path)
    assert len(set(one)) == 12 and not any("_hidden" in p or "skipped" in p for p in one)
    assert [p.split()[0] for p in one[:3]] == ["Complete", "Write", "Explain"]
    every = stdlib_prompts(100, seed=0, root=tmp_path)
    assert len(every) == 36 and len(set(every)) == 36 and every[:12] == one
    assert stdlib_prompts(5, seed=0, root=tmp_path) == one[:5]
    assert stdlib_prompts(20, seed=0, root=tmp_path) == every[:20]
    for name in (f"fn{f}_{i}" for f in range(4) for i in range(3)):  # each in all three kinds
        kinds = {p.split()[0] for p in every if f"{name}(" in p}
        assert kinds == {"Complete", "Write", "Explain"}, name
