"""The HTML report and the live server, on experiment folders written by real searches.

Evolution runs on the `simulated` executor over NAS-Bench-201; PBT runs a tiny trainer on the `local`
executor. The browser tests load the pages in Debian's headless Chromium and check what it drew.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from browser import chromium, console_errors, needs_chromium, screenshot

import nasplat
from nasplat import Choice, Float, Space, Trainer, WorkerContext
from nasplat.core.trees import flatten
from nasplat.report import build_report
from nasplat.report.frame import diff
from nasplat.report.serve import serve

NB201_CSV = Path(__file__).resolve().parents[2] / "shared" / "data" / "nb201.csv"


class Toy(Trainer):
    """A 'model' whose score grows by `lr` (halved with adam) per step; the state is the score."""

    def setup(self, config: dict[str, Any], ctx: WorkerContext) -> None:
        self.score = 0.0

    def step(self) -> dict[str, Any]:
        self.score += self.config["lr"] * (1.0 if self.config["optimizer"] == "sgd" else 0.5)
        return {"score": self.score, "loss": 1.0 / (1.0 + self.score)}

    def state_dict(self) -> dict[str, Any]:
        return {"score": self.score}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.score = state["score"]


def rows(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]


def section(page: str, name: str) -> str:
    match = re.search(rf"<section id='{name}'>(.*?)</section>", page, re.DOTALL)
    assert match, f"no section {name!r} in the report"
    return match.group(1)


@pytest.fixture(scope="module")
def evolution(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not NB201_CSV.exists():
        pytest.skip(f"the NAS-Bench-201 table is not at {NB201_CSV}")
    from search_spaces.nb201 import space
    from trainers.nb201_table import NB201Table

    storage = tmp_path_factory.mktemp("experiments")
    nasplat.run(trainer=NB201Table, space=space, controller="evolution", metric="valid_acc", executor="simulated",
                concurrency=4, time_budget_s=6000, seed=1, storage=storage, name="evo",
                controller_options={"population_size": 10, "sample_size": 3})
    return storage / "evo"


@pytest.fixture(scope="module")
def pbt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    storage = tmp_path_factory.mktemp("experiments")
    space = Space({"lr": Float(1e-3, 1.0, log=True), "optimizer": Choice(["sgd", "adam"])})
    nasplat.run(trainer=Toy, space=space, controller="pbt", metric="score", executor="local", concurrency=4,
                max_trials=4, max_steps=10, seed=0, storage=storage, name="pbt",
                controller_options={"population_size": 4, "perturbation_interval": 2})
    return storage / "pbt"


@pytest.fixture(scope="module")
def evolution_page(evolution: Path) -> str:
    return build_report(evolution).read_text()


@pytest.fixture(scope="module")
def pbt_page(pbt: Path) -> str:
    return build_report(pbt).read_text()


def test_report_is_one_self_contained_file(evolution: Path, evolution_page: str, pbt_page: str) -> None:
    assert (evolution / "report.html").is_file()
    for page in (evolution_page, pbt_page):
        assert page.startswith("<!DOCTYPE html>")
        assert not re.search(r"https?://|<link|<script|src=|@import", page), "the report must not load anything"
        for name in ("summary", "best-so-far", "learning-curves", "pbt", "lineage", "top"):
            section(page, name)
    assert 'aria-label="best-so-far"' in evolution_page and 'aria-label="lineage"' in evolution_page


def test_evolution_lineage_covers_every_child(evolution: Path, evolution_page: str) -> None:
    data = rows(evolution)
    config = {r["trial_id"]: r["config"] for r in data}
    children = {r["trial_id"]: r["parent_id"] for r in data if r["parent_id"] is not None}
    assert len(children) > 50
    lineage = section(evolution_page, "lineage")
    assert f"All {len(children)} mutations" in lineage
    for child, parent in children.items():
        changes = diff(config[parent], config[child])
        assert len(changes) == 1, "regularized evolution changes exactly one decision"
        key, old, new = changes[0]
        cells = [str(child), str(parent), html.escape(f"{key}: {old} → {new}")]
        assert re.search(r"<tr>\s*" + r"\s*".join(f"<td>{re.escape(c)}</td>" for c in cells), lineage), child
    assert "Ancestry of the best trial" in lineage
    assert "Not a PBT experiment" in section(evolution_page, "pbt")
    assert "single step" in section(evolution_page, "learning-curves")


def test_top_trials_table(evolution: Path, evolution_page: str) -> None:
    result = nasplat.ExperimentResult.load(evolution)
    top = section(evolution_page, "top")
    assert top.split("<tbody>", 1)[1].count("<tr>") == 10
    first = re.search(r"<tbody>\s*<tr>\s*<td>1</td>\s*<td>(\d+)</td>", top)
    assert first and int(first.group(1)) == result.best["trial_id"]
    for key in flatten(result.best["config"]):
        assert f"<th>{html.escape(key)}</th>" in top


def test_pbt_schedules_and_exploit_events(pbt: Path, pbt_page: str) -> None:
    events = [r for r in rows(pbt) if r["donor_id"] is not None]
    assert events, "this seeded PBT run exploits at least once"
    part = section(pbt_page, "pbt")
    assert 'aria-label="pbt-schedules"' in part and "<h2>PBT schedules" in part
    assert f"{len(events)} exploit events" in part
    for event in events:
        cells = [str(event["trial_id"]), str(event["step"]), str(event["donor_id"])]
        assert re.search(r"<tr>\s*" + r"\s*".join(f"<td>{c}</td>" for c in cells), part), event
    assert "lr: " in part and " → " in part
    assert "no lineage tree" in section(pbt_page, "lineage")
    assert 'aria-label="learning-curves"' in section(pbt_page, "learning-curves")


def test_report_of_a_starting_experiment_and_of_no_experiment(tmp_path: Path) -> None:
    (tmp_path / "results.jsonl").write_text("")
    (tmp_path / "meta.json").write_text(json.dumps({"name": "fresh", "metric": "acc", "mode": "max"}))
    page = build_report(tmp_path).read_text()
    assert "No successful result yet" in page
    with pytest.raises(FileNotFoundError, match="no results.jsonl"):
        build_report(tmp_path / "missing")


def test_serve_rebuilds_when_results_change(pbt: Path, tmp_path: Path) -> None:
    folder = shutil.copytree(pbt, tmp_path / "live")
    server, url = serve(folder)
    try:
        first = urllib.request.urlopen(url, timeout=30).read().decode()
        version = urllib.request.urlopen(url + "version", timeout=30).read().decode()
        assert "PBT schedules" in first and "fetch(\"/version\"" in first and "trial 777" not in first
        row = {**rows(folder)[-1], "trial_id": 777, "step": 1, "status": "completed", "donor_id": None,
               "score": 1e6}
        with open(folder / "results.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        assert urllib.request.urlopen(url + "version", timeout=30).read().decode() != version
        second = urllib.request.urlopen(url, timeout=30).read().decode()
        assert "trial 777" in second and "5 (5 completed)" in second
        assert "trial 777" in (folder / "report.html").read_text()  # the file on disk is rebuilt too
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(url + "../results.jsonl", timeout=30)
    finally:
        server.shutdown()
        server.server_close()


def test_serve_waits_for_an_experiment_to_start(tmp_path: Path) -> None:
    server, url = serve(tmp_path)
    blocking = threading.Thread(target=server.serve_forever)  # what `nasplat serve` does after serve()
    blocking.start()
    try:
        assert "Waiting for" in urllib.request.urlopen(url, timeout=30).read().decode()
        assert blocking.is_alive()
    finally:
        server.shutdown()
        server.server_close()
    blocking.join(timeout=10)
    assert not blocking.is_alive(), "serve_forever() must return once the server is shut down"
    with pytest.raises(ValueError, match="port"):
        serve(tmp_path, port=70000)


# -- a real browser ------------------------------------------------------------------------------------
@needs_chromium
def test_browser_reports_javascript_errors_the_way_we_look_for_them(tmp_path: Path) -> None:
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><html><body><script>notDefinedAnywhere();</script></body></html>")
    assert console_errors(chromium(page.as_uri(), tmp_path, "--dump-dom").stderr), "the check would miss errors"


@needs_chromium
@pytest.mark.parametrize("which", ["evolution", "pbt"])
def test_browser_draws_the_static_report(which: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    folder = request.getfixturevalue(which)
    report = build_report(folder)
    dom = chromium(report.as_uri(), tmp_path, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert not console_errors(dom.stderr)
    svgs = re.findall(r"<svg[^>]*>(.*?)</svg>", dom.stdout, re.DOTALL)
    assert len(svgs) >= (2 if which == "evolution" else 3)
    assert all(svg.count("<path") >= 10 for svg in svgs)
    screenshot(report, tmp_path)


@needs_chromium
def test_browser_runs_the_live_page(pbt: Path, tmp_path: Path) -> None:
    server, url = serve(shutil.copytree(pbt, tmp_path / "live"))
    try:
        dom = chromium(url, tmp_path, "--dump-dom")
    finally:
        server.shutdown()
        server.server_close()
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert not console_errors(dom.stderr)
    assert 'data-live="polling"' in dom.stdout, "the polling script did not run"
    assert len(re.findall(r"<svg", dom.stdout)) >= 3
