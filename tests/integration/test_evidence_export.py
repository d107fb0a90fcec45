"""Evidence an auditor can open and check, through a real signing `handoffs serve`: the
verify command an export prints (run from another directory), bulk export by task, agent
and window with its manifest, `evidence verify DIR` catching an edited file, `evidence
show` as text and as one self-contained HTML page (screenshots in headless Chromium), and
verify without a store or a key."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

from analytics import evidence_package
from analytics.evidence.export import Selection, zip_export
from foundation.keys import generate_keypair
from handoffs.cli import main
from ingest.testing import request_json, span_json, transition
from serve.testing import start_serve, wait_until

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
SHOTS = Path("/tmp/shots-52")
_STEPS = [("create", "", "created"), ("accept", "created", "accepted"),
          ("start", "accepted", "running"), ("commit", "running", "committed")]  # fmt: skip
#: handoff -> (task, to_agent)
HANDOFFS = {"hx-1": ("tx-1", "coder"), "hx-2": ("tx-1", "reviewer"), "hx-3": ("tx-2", "coder")}


def _send(url: str, t0: int) -> None:
    spans = []
    for n, (hid, (task, agent)) in enumerate(HANDOFFS.items()):
        for i, (ev, f, t) in enumerate(_STEPS):
            extra: dict = {"handoff__to_agent": agent} if ev == "create" else {}
            if ev == "commit":
                extra = {"handoff__evidence__count": 1, "handoff__evidence__valid": True,
                         "handoff__evidence_refs": ["doc:report-7"]}  # fmt: skip
            spans.append(span_json(trace_id=f"{n + 1:032x}", span_id=f"{n + 1:08x}{i + 1:08x}",
                                   start_ns=t0 + (n * 10 + i) * 10**9,
                                   attributes=transition(hid, ev, f, t, task_id=task, actor=agent
                                                         if ev != "create" else "planner", **extra)))  # fmt: skip
    req = urllib.request.Request(
        f"{url}/v1/traces",
        data=json.dumps(request_json(spans)).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200


@pytest.fixture(scope="module")
def signed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("signed")
    data = tmp / "data"
    data.mkdir(mode=0o700)
    _key, pub, _ = generate_keypair(data / "ledger")  # beside the store, as the demo keeps it
    serve = start_serve(
        tmp, store_dir=data, extra_args=("--signing-key", str(_key), "--sign-every", "0.2")
    )
    try:
        _send(serve.otlp_url, time.time_ns() - 3600 * 10**9)
        serve.wait_stored()

        def all_signed() -> bool:
            c = serve.client()
            try:
                pkg = evidence_package(c, database=serve.database, handoff_id="hx-3")
                assert pkg is not None
            finally:
                c.close()
            return bool(
                pkg and pkg["integrity"]["log"]["head"] and not pkg["integrity"]["log"]["pending"]
            )

        wait_until(all_signed, 60, "every transition signed", every=0.2)
        yield {"serve": serve, "pub": pub, "store": ["--store", serve.query_url]}
    finally:
        serve.stop()


def _env() -> dict[str, str]:
    return {
        k: v for k, v in os.environ.items() if k not in ("HANDOFFS_STORE", "HANDOFFS_SIGNING_KEY")
    }


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "handoffs", *args], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def _printed(out: str, prefix: str) -> list[str]:
    line = next(ln for ln in out.splitlines() if ln.startswith(prefix))
    cmd = shlex.split(line.split(": ", 1)[1])
    assert cmd[:3] == ["handoffs", "evidence", "verify"], line
    return cmd[1:]


def test_printed_verify_commands_work_from_another_directory(signed, tmp_path):
    here, elsewhere = tmp_path / "export", tmp_path / "elsewhere"
    here.mkdir()
    elsewhere.mkdir()
    r = _run(["evidence", "hx-1", *signed["store"], "--out", "pkg.json"], here)
    assert r.returncode == 0, r.stderr
    offline = _printed(r.stdout, "check it offline with:")
    assert str(signed["pub"].resolve()) in offline and str(here / "pkg.json") in offline
    with_store = _printed(r.stdout, "or against the store:")
    for cmd in (offline, with_store):
        v = _run(cmd, elsewhere)
        assert v.returncode == 0, (cmd, v.stdout, v.stderr)
        assert v.stdout.startswith("OK:")


def test_verify_without_store_or_key_says_both_ways(signed, tmp_path):
    assert main(["evidence", "hx-1", *signed["store"], "--out", str(tmp_path / "p.json")]) == 0
    r = _run(["evidence", "verify", "p.json"], tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--public-key" in r.stderr and "--store" in r.stderr and "offline" in r.stderr
    assert "Traceback" not in r.stderr and "chdb" not in r.stderr.lower()
    r = _run(["evidence", "p.json"], tmp_path)  # a file name is not an id
    assert r.returncode == 2 and "evidence show p.json" in r.stderr, r.stderr


def test_bulk_export_verifies_and_names_an_edited_file(signed, tmp_path, capsys):
    out = tmp_path / "tx-1"
    assert main(["evidence", "export", "--task", "tx-1", *signed["store"], "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "wrote 2 packages" in printed
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(manifest["files"]) == ["hx-1.json", "hx-2.json"]
    assert manifest["counts"] == {"handoffs": 2, "transitions": 8, "unsigned": 0}
    assert manifest["heads"] and manifest["selection"] == {"task_id": "tx-1"}
    pub = ["--public-key", str(signed["pub"])]
    assert main(["evidence", "verify", str(out), *pub]) == 0
    assert capsys.readouterr().out.startswith("OK:")
    assert main(["evidence", "verify", str(out), *signed["store"]]) == 0
    capsys.readouterr()
    # one file edited: the manifest's hash and the package's own proofs both name it
    pkg = json.loads((out / "hx-2.json").read_text())
    pkg["transitions"][-1]["actor"] = "mallory"
    (out / "hx-2.json").write_text(json.dumps(pkg, indent=2))
    assert main(["evidence", "verify", str(out), *pub]) == 1
    failed = capsys.readouterr().out
    assert "FAILED" in failed and "hx-2.json: edited after export" in failed
    assert "hx-1.json" not in failed
    # by agent, and by window: the agent's handoffs across tasks
    by_agent = tmp_path / "coder"
    args = ["evidence", "export", "--agent", "coder", *signed["store"], "--out", str(by_agent)]
    assert main(args) == 0
    assert sorted(json.loads((by_agent / "manifest.json").read_text())["files"]) == [
        "hx-1.json",
        "hx-3.json",
    ]
    window = tmp_path / "window"
    args = ["evidence", "export", "--from", "2000-01-01T00:00:00Z", "--to",
            "2100-01-01T00:00:00Z", *signed["store"], "--out", str(window)]  # fmt: skip
    assert main(args) == 0
    assert len(json.loads((window / "manifest.json").read_text())["files"]) == 3
    assert main(["evidence", "export", *signed["store"], "--out", str(tmp_path / "none")]) == 2
    # the dashboard's task download: the same export, zipped, that verifies once unzipped
    c = signed["serve"].client()
    try:
        blob = zip_export(c, database=signed["serve"].database, selection=Selection(task_id="tx-1"))
    finally:
        c.close()
    unzipped = tmp_path / "unzipped"
    zipfile.ZipFile(io.BytesIO(blob)).extractall(unzipped)
    assert sorted(p.name for p in unzipped.iterdir()) == ["hx-1.json", "hx-2.json", "manifest.json"]
    assert main(["evidence", "verify", str(unzipped), *pub]) == 0


def test_show_text_and_self_contained_html(signed, tmp_path, capsys):
    pkg = tmp_path / "hx-1.json"
    assert main(["evidence", "hx-1", *signed["store"], "--out", str(pkg)]) == 0
    capsys.readouterr()
    assert main(["evidence", "show", str(pkg)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("NOT VERIFIED:") and "commit" in text and "doc:report-7" in text
    assert main(["evidence", "show", str(pkg), "--public-key", str(signed["pub"])]) == 0
    assert capsys.readouterr().out.startswith("PASS:")
    page = tmp_path / "hx-1.html"
    args = ["evidence", "show", str(pkg), "--format", "html", "--out", str(page),
            "--public-key", str(signed["pub"])]  # fmt: skip
    assert main(args) == 0
    html = page.read_text()
    assert "PASS" in html and "Glossary" in html and "hx-1" in html and "doc:report-7" in html
    assert re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", html, re.I) is None
    assert "<script" not in html.lower() and "@import" not in html
    # an edited package: FAIL, with the problem on the page
    doc = json.loads(pkg.read_text())
    doc["transitions"][1]["actor"] = "mallory"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    args = ["evidence", "show", str(bad), "--format", "html", "--out", str(tmp_path / "bad.html"),
            "--public-key", str(signed["pub"])]  # fmt: skip
    assert main(args) == 1
    assert "FAIL" in (tmp_path / "bad.html").read_text()
    _screenshots(page)


def _screenshots(page: Path) -> None:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright python package is not installed (pip install -e '.[dev]')")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} not found")
    SHOTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(page, SHOTS / page.name)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox"])
        requests: list[str] = []
        try:
            for w, h in ((1440, 900), (1280, 720)):
                tab = browser.new_page(viewport={"width": w, "height": h})
                tab.on("request", lambda r: requests.append(r.url))
                tab.goto(page.as_uri())
                tab.screenshot(path=str(SHOTS / f"evidence-{w}x{h}.png"))
                tab.screenshot(path=str(SHOTS / f"evidence-{w}x{h}-full.png"), full_page=True)
                assert [u for u in requests if not u.startswith("file:")] == []
                tab.close()
        finally:
            browser.close()


def test_rows_stored_before_the_first_key_are_named(tmp_path):
    from analytics.evidence.gap import late_signing, notes_for

    data = tmp_path / "data"
    serve = start_serve(tmp_path, store_dir=data)  # no key: heads unsigned
    try:
        _send(serve.otlp_url, time.time_ns() - 3600 * 10**9)
        serve.wait_stored()
    finally:
        serve.stop()
    key, _pub, _ = generate_keypair(tmp_path / "k")
    serve = start_serve(
        tmp_path, store_dir=data, extra_args=("--signing-key", str(key), "--sign-every", "0.2")
    )
    try:
        c = serve.client()
        try:

            def signed() -> bool:
                pkg = evidence_package(c, database=serve.database, handoff_id="hx-1")
                return bool(pkg and not pkg["integrity"]["log"]["pending"])

            wait_until(signed, 60, "the rows stored unsigned signed", every=0.2)
            # the restart took longer than half a second: every earlier batch is late
            late = late_signing(c, serve.database, late_after_s=0.5)
            pkg = evidence_package(c, database=serve.database, handoff_id="hx-1")
            assert pkg is not None
            assert late_signing(c, serve.database) == []  # within a minute: not "late" by default
        finally:
            c.close()
    finally:
        serve.stop()
    assert len(late) == 1 and late[0].end_leaf == 12 and late[0].batches >= 1
    (note,) = notes_for(pkg, late)
    assert re.fullmatch(
        r"rows( of instance \S+)? stored before \S+Z were signed at \S+Z when serve first ran "
        r"with a key \(\d+ batch(es)?\): 4 of this package's transitions",
        note,
    ), note


def test_the_demo_signs_and_its_packages_verify_offline(tmp_path):
    from serve.testing import free_port

    data = tmp_path / "handoffs-data"
    cmd = ["demo", "--data", str(data), "--no-dashboard", "--no-progress", "--otlp-port",
           str(free_port()), "--query-port", str(free_port()), "--backfill-days", "1",
           "--backfill-handoffs", "20", "--duration", "2", "--seed", "3"]  # fmt: skip
    r = _run(cmd, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    pub = data / "ledger.pub"
    assert f"evidence packages are signed: verify with --public-key {pub}" in r.stdout
    assert (data / "ledger.key").stat().st_mode & 0o777 == 0o600
    store = f"chdb://{data}"
    c = subprocess.run([sys.executable, "-c", "import sys; from foundation.store import parse_store, connect; "
                        "print(connect(parse_store(sys.argv[1])).query('SELECT any(handoff_id) FROM "
                        "handoffs.handoff_transitions').result_rows[0][0])", store],
                       capture_output=True, text=True, timeout=120, env=_env())  # fmt: skip
    assert c.returncode == 0, c.stderr
    hid = c.stdout.strip()
    e = _run(["evidence", hid, "--store", store, "--out", "pkg.json"], tmp_path)
    assert e.returncode == 0, e.stderr
    offline = _printed(e.stdout, "check it offline with:")
    assert str(pub) in offline
    v = _run(offline, tmp_path / "handoffs-data" / "logs")
    assert v.returncode == 0 and v.stdout.startswith("OK:"), v.stdout + v.stderr
