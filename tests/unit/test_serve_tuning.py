"""serve's process tuning (serve._tuning): what a Tuning asks of a process, decided from
plain values (which store, which environment, which modules already imported)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from foundation import settings
from serve._tuning import (
    DATAFRAME_LIBS,
    JEMALLOC_CONF,
    M_ARENA_MAX,
    M_MMAP_THRESHOLD,
    M_TRIM_THRESHOLD,
    MERGE_THREAD,
    SETTINGS,
    MergePriority,
    Plan,
    Tuning,
    plan,
)

EMBEDDED: dict[str, Any] = {"embedded": True, "environ": {}, "loaded": ()}


def test_defaults_are_the_settings_defaults() -> None:
    t = Tuning()
    assert t == Tuning.resolve()  # no HANDOFFS_* tuning variable set in the test run
    assert t.malloc_arenas == 2 and t.mmap_threshold == 1 << 20
    assert t.engine_malloc_conf == JEMALLOC_CONF == "dirty_decay_ms:200,tcache_max:1024"
    assert (t.engine_purge, t.overlap_max_rss) == ("auto", 240 << 20)
    assert (t.merge_nice, t.query_thread_nice, t.keep_dataframe_libs_out) == (10, 10, True)


def test_every_tuning_setting_is_declared_and_documented() -> None:
    assert set(SETTINGS) <= set(settings.ENV)
    assert all(s.env.startswith("HANDOFFS_") and s.doc for s in SETTINGS)
    assert len(SETTINGS) == len(Tuning.__slots__)  # one setting per knob


def test_default_plan_for_the_embedded_store() -> None:
    p = plan(Tuning(), **EMBEDDED)
    assert p.mallopt == (
        (M_ARENA_MAX, 2),
        (M_MMAP_THRESHOLD, 1 << 20),
        (M_TRIM_THRESHOLD, 1 << 20),
    )
    assert p.engine_malloc_conf == JEMALLOC_CONF
    assert p.block_imports == DATAFRAME_LIBS
    # serve's own decay in effect: purges after writes, not under load
    assert (p.purge_memory, p.purge_under_load) == (True, False)
    assert (p.overlap_max_rss, p.merge_nice, p.query_thread_nice) == (240 << 20, 10, 10)


def test_off_plans_nothing() -> None:
    assert plan(Tuning.off(), **EMBEDDED) == Plan()


@pytest.mark.parametrize(
    ("knob", "changed"),
    [
        ({"malloc_arenas": 0}, {"mallopt"}),
        ({"mmap_threshold": 0}, {"mallopt"}),
        # jemalloc's defaults: no options set, and purges under load take their place
        ({"engine_malloc_conf": ""}, {"engine_malloc_conf", "purge_under_load"}),
        ({"engine_purge": "off"}, {"purge_memory"}),
        ({"overlap_max_rss": 0}, {"overlap_max_rss"}),
        ({"merge_nice": 0}, {"merge_nice"}),
        ({"query_thread_nice": 0}, {"query_thread_nice"}),
        ({"keep_dataframe_libs_out": False}, {"block_imports"}),
    ],
)
def test_each_knob_turns_off_alone(knob: dict, changed: set[str]) -> None:
    base = plan(Tuning(), **EMBEDDED)
    off = plan(Tuning(**knob), **EMBEDDED)
    diff = {name for name in Plan.__slots__ if getattr(base, name) != getattr(off, name)}
    assert diff == changed


def test_mallopt_without_arenas_keeps_the_threshold() -> None:
    assert plan(Tuning(malloc_arenas=0, mmap_threshold=4096), **EMBEDDED).mallopt == (
        (M_MMAP_THRESHOLD, 4096),
        (M_TRIM_THRESHOLD, 4096),
    )


def test_a_server_store_gets_only_the_process_knobs() -> None:
    p = plan(Tuning(), embedded=False, environ={}, loaded=())
    assert p.mallopt and p.block_imports == DATAFRAME_LIBS
    assert p.engine_malloc_conf is None
    assert not (p.purge_memory or p.purge_under_load)
    assert (p.overlap_max_rss, p.merge_nice, p.query_thread_nice) == (0, 0, 0)


def test_an_operators_allocator_options_win_and_bring_purges_under_load() -> None:
    p = plan(Tuning(), embedded=True, environ={"JE_MALLOC_CONF": "dirty_decay_ms:5000"}, loaded=())
    assert p.engine_malloc_conf is None
    assert (p.purge_memory, p.purge_under_load) == (True, True)
    # the operator's value equal to serve's: the engine decays promptly all the same
    same = plan(Tuning(), embedded=True, environ={"JE_MALLOC_CONF": JEMALLOC_CONF}, loaded=())
    assert (same.engine_malloc_conf, same.purge_under_load) == (None, False)


def test_engine_loaded_already_its_options_are_left_alone() -> None:
    p = plan(Tuning(), embedded=True, environ={}, loaded=("chdb", "numpy"))
    assert p.engine_malloc_conf is None
    assert p.purge_under_load  # the engine runs with jemalloc's own decay
    assert "numpy" not in p.block_imports and "pandas" in p.block_imports


@pytest.mark.parametrize(
    ("purge", "conf", "want"),
    [
        ("idle", JEMALLOC_CONF, (True, False)),
        ("idle", "", (True, False)),
        ("load", JEMALLOC_CONF, (True, True)),
        ("auto", "", (True, True)),
        ("off", "", (False, False)),
    ],
)
def test_engine_purge_modes(purge: str, conf: str, want: tuple[bool, bool]) -> None:
    p = plan(Tuning(engine_purge=purge, engine_malloc_conf=conf), **EMBEDDED)
    assert (p.purge_memory, p.purge_under_load) == want


def test_resolve_reads_arguments_then_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HANDOFFS_MMAP_THRESHOLD", "0")
    monkeypatch.setenv("HANDOFFS_ENGINE_MALLOC_CONF", "off")
    monkeypatch.setenv("HANDOFFS_ENGINE_PURGE", "LOAD")
    monkeypatch.setenv("HANDOFFS_MERGE_NICE", "15")
    monkeypatch.setenv("HANDOFFS_KEEP_DATAFRAME_LIBS_OUT", "0")
    t = Tuning.resolve(merge_nice=5)
    assert (t.mmap_threshold, t.engine_malloc_conf, t.engine_purge) == (0, "", "load")
    assert (t.merge_nice, t.keep_dataframe_libs_out) == (5, False)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"merge_nice": 20}, "--merge-nice must be 0 to 19, got 20"),
        ({"query_thread_nice": -1}, "--query-thread-nice must be 0 to 19, got -1"),
        ({"mmap_threshold": -1}, "mmap_threshold must be 0 or more, got -1"),
        ({"engine_purge": "always"}, "HANDOFFS_ENGINE_PURGE must be one of auto, idle, load, off"),
    ],
)
def test_bad_values_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Tuning(**kwargs)


def test_a_bad_variable_names_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HANDOFFS_MALLOC_ARENAS", "two")
    with pytest.raises(ValueError, match="HANDOFFS_MALLOC_ARENAS must be an integer"):
        Tuning.resolve()


def test_apply_sets_the_engine_options_and_blocks_the_libraries() -> None:
    # in a fresh interpreter: what serve's process does before its engine loads
    code = (
        "import os, sys\n"
        "from serve._tuning import Tuning, apply_process, plan\n"
        "p = plan(Tuning(), embedded=True, environ=os.environ, loaded=sys.modules)\n"
        "print(apply_process(p), os.environ['JE_MALLOC_CONF'])\n"
        "try:\n    import pandas\nexcept ImportError:\n    print('pandas blocked')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "JE_MALLOC_CONF"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.stdout.splitlines() == [f"[] {JEMALLOC_CONF}", "pandas blocked"], out.stderr


def _tasks(root: Path, names: dict[int, str]) -> Path:
    """A /proc/self/task look-alike: one directory per thread id with its `comm`."""
    for tid, name in names.items():
        (root / str(tid)).mkdir(parents=True)
        (root / str(tid) / "comm").write_text(name + "\n")
    return root


def test_merge_priority_finds_merge_threads_and_zero_is_off(tmp_path: Path) -> None:
    # thread ids no process has: renicing them fails, and MergePriority carries on
    tasks = _tasks(
        tmp_path, {2**22 + 1: MERGE_THREAD, 2**22 + 2: "python", 2**22 + 3: MERGE_THREAD}
    )
    assert MergePriority(10, tasks=tasks).poll() == 2
    assert MergePriority(0, tasks=tasks).poll() == 0
    assert MergePriority(10, tasks=tmp_path / "no-proc").poll() == 0
