"""`nasplat report` and `nasplat serve` on folders and files from elsewhere (issue 30): a read-only folder, requests
with another site's `Host:`, a ground truth that would fill the memory or matches nothing by the way it writes
numbers, a metric name matplotlib would read as mathtext, HTML in every field.

The read-only folder is a real read-only bind mount, made inside a private mount namespace (`unshare -rm`): root
ignores permission bits, not a read-only mount, and the mount goes away with the process.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from servers import free_port, server

import nasplat
from nasplat import Choice, Trainer, WorkerContext
from nasplat.cli import main
from nasplat.report import build_report, oneshot, render_report
from nasplat.report.oneshot import load_ground_truth

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
# the code under test first (PYTHONPATH as given, then this checkout), and this folder for the trainer and space
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(REPO), str(TESTS)]))}
SPACE = {"depth": Choice([1, 2, 3, 4, 5, 6, 7, 8]), "width": Choice([16, 32])}
ODD_METRIC = "loss$\\frac{$"  # unbalanced mathtext: matplotlib cannot parse it as math


class Grid(Trainer):
    """Scores `depth / 10 + width / 100` (distinct for every architecture) for 3 steps, rising."""

    def setup(self, config: dict[str, Any], ctx: WorkerContext) -> None:
        self.value, self.steps = config["depth"] / 10 + config["width"] / 100, 0

    def step(self) -> dict[str, Any]:
        self.steps += 1
        return {"score": self.value * self.steps / 3, ODD_METRIC: 1.0 / (self.value * self.steps)}


def section(page: str, name: str) -> str:
    match = re.search(rf"<section id='{name}'>(.*?)</section>", page, re.DOTALL)
    assert match, f"no section {name!r} in the report"
    return match.group(1)


@pytest.fixture(scope="module")
def grid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 random architectures of 16, 3 steps each, kept as plain data (names and dotted paths)."""
    storage = tmp_path_factory.mktemp("safety")
    nasplat.run(trainer="test_report_safety:Grid", space="test_report_safety:SPACE", metric="score",
                controller="random", seed=0, max_trials=12, max_steps=3, storage=storage, name="grid")
    return storage / "grid"


def architectures(folder: Path) -> dict[tuple[int, int], float]:
    """Each trial's architecture and its last score."""
    rows = nasplat.ExperimentResult.load(folder).rows
    return {(r["config"]["depth"], r["config"]["width"]): r["score"] for r in rows}


# -- 1. a read-only folder ------------------------------------------------------------------------------------------
def read_only(source: Path, view: Path, command: list[str]) -> list[str]:
    """`command` run where `view` is a read-only bind mount of `source` (checked: a write there must fail)."""
    view.mkdir(parents=True, exist_ok=True)
    script = (f'mount --bind "{source}" "{view}" && mount -o remount,bind,ro "{view}" && '
              f'! touch "{view}/.probe" 2>/dev/null && exec "$@"')
    return ["unshare", "-rm", "sh", "-c", script, "sh", *command]


def _can_mount_read_only() -> str:
    """'' when a private read-only bind mount works here, else why not."""
    with tempfile.TemporaryDirectory() as scratch:
        source, view = Path(scratch, "source"), Path(scratch, "view")
        source.mkdir()
        try:
            probe = subprocess.run(read_only(source, view, ["true"]), capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return str(exc)
    return "" if probe.returncode == 0 else probe.stderr.strip() or f"exit code {probe.returncode}"


needs_ro_mount = pytest.mark.skipif(bool(_can_mount_read_only()), reason="no private read-only bind mount here "
                                                                        "(unshare -rm, mount --bind -o ro)")


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "nasplat.cli", *args]


@needs_ro_mount
def test_report_of_a_read_only_folder_goes_elsewhere(grid: Path, tmp_path: Path) -> None:
    view, work = tmp_path / "mount" / "grid", tmp_path / "work"
    work.mkdir()
    before = sorted(p.name for p in grid.iterdir())

    default = subprocess.run(read_only(grid, view, cli("report", str(view))), cwd=work, env=ENV, capture_output=True,
                             text=True, timeout=300)
    assert default.returncode == 0, default.stderr
    written = work / "grid-report.html"
    assert default.stdout.splitlines() == [f"report: {written} ({view} is not writable: EROFS (Read-only file "
                                           "system); -o FILE to choose where)"]
    assert written.read_text().startswith("<!DOCTYPE html>") and "12 (12 completed)" in written.read_text()

    chosen = tmp_path / "elsewhere" / "page.html"
    chosen.parent.mkdir()
    explicit = subprocess.run(read_only(grid, view, cli("report", str(view), "-o", str(chosen))), cwd=work, env=ENV,
                              capture_output=True, text=True, timeout=300)
    assert explicit.returncode == 0 and explicit.stdout == f"report: {chosen}\n", explicit.stderr
    assert "12 (12 completed)" in section(chosen.read_text(), "summary")

    stdout = subprocess.run(read_only(grid, view, cli("report", str(view), "-o", "-")), cwd=work, env=ENV,
                            capture_output=True, text=True, timeout=300)
    assert stdout.returncode == 0, stdout.stderr
    assert stdout.stdout.startswith("<!DOCTYPE html>") and stdout.stdout.endswith("</html>\n")
    assert "12 (12 completed)" in section(stdout.stdout, "summary")
    assert sorted(p.name for p in grid.iterdir()) == before, "nothing was written into the folder"


def test_report_output_never_overwrites_the_experiments_own_files(grid: Path, capsys: Any) -> None:
    rows = (grid / "results.jsonl").read_bytes()
    assert main(["report", str(grid), "-o", str(grid / "results.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err == (f"nasplat report: error: -o {grid / 'results.jsonl'} is inside the experiment folder {grid}: "
                   f"the report may only replace its report.html there; choose a file outside it\n")
    assert (grid / "results.jsonl").read_bytes() == rows
    assert main(["report", str(grid), "-o", str(grid / "report.html")]) == 0  # its own page, as without -o
    assert capsys.readouterr().out == f"report: {grid / 'report.html'}\n"


@needs_ro_mount
def test_serve_shows_a_read_only_folder(grid: Path, tmp_path: Path) -> None:
    view, port = tmp_path / "ro", free_port()
    command = read_only(grid, view, cli("serve", str(view), "--port", str(port)))
    with server(command, f"http://127.0.0.1:{port}/version", tmp_path / "serve.log", PYTHONPATH=ENV["PYTHONPATH"]):
        status, page = get(port, "/", f"127.0.0.1:{port}")
    assert status == 200 and "Could not build" not in page
    assert "12 (12 completed)" in section(page, "summary") and 'aria-label="best-so-far"' in page
    log = (tmp_path / "serve.log").read_text()
    assert f"nasplat: note: cannot keep {view / 'report.html'} up to date (EROFS (Read-only file system)): the " \
           "page is served from memory" in log


# -- 2. the Host header ---------------------------------------------------------------------------------------------
def get(port: int, path: str, host: str | None) -> tuple[int, str]:
    """GET `path` from 127.0.0.1:`port` with this `Host:` header (none at all for None)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.putrequest("GET", path, skip_host=True)
        if host is not None:
            connection.putheader("Host", host)
        connection.endheaders()
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


@pytest.fixture(scope="module")
def serving(grid: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A real `nasplat serve` of the grid on 127.0.0.1; yields its port."""
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with server(cli("serve", str(grid), "--port", str(port)), f"http://127.0.0.1:{port}/version", log,
                PYTHONPATH=ENV["PYTHONPATH"]):
        yield port


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "LocalHost:{port}", "[::1]:{port}"])
def test_serve_answers_its_own_names(serving: int, host: str) -> None:
    status, page = get(serving, "/", host.format(port=serving))
    assert status == 200 and "12 (12 completed)" in section(page, "summary")
    assert get(serving, "/version", host.format(port=serving))[0] == 200


def refusal(header: str | None, allowed: str) -> str:
    shown = "no Host header" if header is None else f"Host {header!r}"
    return (f"403: {shown} is not an address of this server (allowed: {allowed}): refused, as a page of another "
            f"site could reach this server by DNS rebinding; nasplat serve --allow-host NAME allows a name\n")


@pytest.mark.parametrize("host", ["attacker.example:{port}", "attacker.example", "localhost", "127.0.0.1:1",
                                  "localhost.attacker.example:{port}", "127.0.0.1:{port}@attacker.example", "", None])
@pytest.mark.parametrize("path", ["/", "/version", "/report.html"])
def test_serve_refuses_other_hosts_as_dns_rebinding_would_send(serving: int, host: str | None, path: str) -> None:
    header = None if host is None else host.format(port=serving)
    status, body = get(serving, path, header)
    assert status == 403, (header, status, body[:200])
    assert body == refusal(header, f"localhost:{serving}, 127.0.0.1:{serving}, [::1]:{serving}")


def test_serve_allows_the_names_it_is_told(grid: Path, tmp_path: Path) -> None:
    port = free_port()
    command = cli("serve", str(grid), "--port", str(port), "--host", "localhost", "--allow-host", "Reports.Example")
    with server(command, f"http://127.0.0.1:{port}/version", tmp_path / "serve.log", PYTHONPATH=ENV["PYTHONPATH"]):
        assert get(port, "/", f"reports.example:{port}")[0] == 200
        assert get(port, "/", f"localhost:{port}")[0] == 200
        status, body = get(port, "/", f"other.example:{port}")
    assert status == 403
    assert body == refusal(f"other.example:{port}", f"localhost:{port}, 127.0.0.1:{port}, [::1]:{port}, "
                                                    f"reports.example:{port}")


def test_the_host_check_for_tunnels_every_interface_and_bad_names() -> None:
    from nasplat.report.serve import HostCheck  # new with the check: imported here to run the rest on older code

    tunnel = HostCheck("127.0.0.1", 8365, "127.0.0.1", ("localhost:9000",))
    assert tunnel.refusal("localhost:9000") == "" and tunnel.refusal("localhost:8365") == ""
    assert tunnel.refusal("attacker.example:9000").startswith("403: Host 'attacker.example:9000' is not")
    everywhere = HostCheck("0.0.0.0", 8365, "0.0.0.0")  # reached by any address of the machine, never by a name
    assert everywhere.refusal("192.168.1.20:8365") == "" and everywhere.refusal("[fe80::1]:8365") == ""
    assert everywhere.refusal("192.168.1.20:80").startswith("403") and everywhere.refusal("lan.example:8365")
    with pytest.raises(ValueError, match=r"--allow-host must be a host name or address with an optional :port, "
                                         r"got 'a b:1'"):
        HostCheck("127.0.0.1", 8365, "127.0.0.1", ("a b:1",))


# -- 3. a ground truth that would fill the memory -------------------------------------------------------------------
def compressible_parquet(path: Path, rows: int) -> Path:
    """A parquet file of `rows` rows of the grid's decisions and score, all alike: a few kB on disk."""
    part = 1_000_000
    chunk = pa.table({"depth": pa.array([1] * part, pa.int64()), "width": pa.array([16] * part, pa.int64()),
                      "score": pa.array([0.5] * part, pa.float64())})
    with pq.ParquetWriter(path, chunk.schema, compression="zstd") as writer:
        for _ in range(rows // part):
            writer.write_table(chunk)
    return path


def test_a_huge_parquet_ground_truth_is_refused_by_its_metadata(grid: Path, tmp_path: Path, capsys: Any) -> None:
    rows = 8_000_000
    truth = compressible_parquet(tmp_path / "truth.parquet", rows)
    assert truth.stat().st_size < 1_000_000 and pq.ParquetFile(truth).metadata.num_rows == rows
    tracemalloc.start()
    try:
        with pytest.raises(ValueError) as refused:
            load_ground_truth(truth, ["depth", "width"], "score")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    limit = oneshot.MAX_GROUND_TRUTH_ROWS
    assert limit < rows
    message = (f"the ground truth {str(truth)!r} holds {rows:,} rows, more than the limit of {limit:,} "
               f"(--ground-truth-max-rows to raise it)")
    assert str(refused.value) == message
    assert peak < 8_000_000, f"{peak:,} bytes allocated to refuse it: the rows were read"  # 8 M rows: 192 MB
    assert main(["report", str(grid), "--ground-truth", str(truth)]) == 2
    assert capsys.readouterr().err == f"nasplat report: error: {message}\n"


def test_a_parquet_ground_truth_whose_values_decompress_too_far_is_refused(tmp_path: Path) -> None:
    truth = tmp_path / "wide.parquet"  # 3 rows, each depth a string of 4 MB: one copy stored, three once read
    pq.write_table(pa.table({"depth": ["1" * 4_000_000] * 3, "width": [16] * 3, "score": [0.5] * 3}), truth,
                   compression="zstd")
    assert truth.stat().st_size < 100_000

    def refusal(max_rows: int) -> str:
        with pytest.raises(ValueError) as refused:
            load_ground_truth(truth, ["depth", "width"], "score", max_rows=max_rows)
        return str(refused.value)

    prefix = f"the ground truth {str(truth)!r}: its columns ['depth', 'width', 'score'] decompress to "
    by_metadata = refusal(1000)  # the one copy stored is already past the limit: nothing is read
    assert re.fullmatch(re.escape(prefix) + r"4,000,\d{3} bytes, more than the limit of 1,024,000 \(1024 bytes a "
                        r"row of --ground-truth-max-rows 1,000\)", by_metadata), by_metadata
    by_use = refusal(8000)  # the stored copy fits, its three uses do not
    assert re.fullmatch(re.escape(prefix) + r"12,000,\d{3} bytes, more than the limit of 8,192,000 \(1024 bytes a "
                        r"row of --ground-truth-max-rows 8,000\)", by_use), by_use
    fits = load_ground_truth(truth, ["depth", "width"], "score", max_rows=20_000)
    assert len(fits) == 1 and fits["standalone"].tolist() == [0.5]


def test_the_ground_truth_limit_bounds_text_tables_too(grid: Path, tmp_path: Path, capsys: Any) -> None:
    searched = architectures(grid)
    truth = tmp_path / "truth.csv"
    pd.DataFrame([{"depth": d, "width": w, "score": s} for (d, w), s in searched.items()]).to_csv(truth, index=False)
    assert main(["report", str(grid), "--ground-truth", str(truth), "--ground-truth-max-rows", "5"]) == 2
    assert capsys.readouterr().err == (f"nasplat report: error: the ground truth {str(truth)!r} holds more than "
                                       f"5 rows, the limit (--ground-truth-max-rows to raise it)\n")
    assert main(["report", str(grid), "--ground-truth", str(truth), "--ground-truth-max-rows", f"{len(searched)}"]) == 0
    assert "Kendall tau +1.000" in section((grid / "report.html").read_text(), "weight-sharing")


# -- 4. ground-truth keys -------------------------------------------------------------------------------------------
def test_ground_truth_numbers_match_however_they_are_written(grid: Path, tmp_path: Path) -> None:
    searched = architectures(grid)
    assert len(searched) >= 3
    truth = tmp_path / "truth.csv"  # depth as 1.0, width as 16.0: how a float column writes them
    frame = pd.DataFrame([{"depth": float(d), "width": float(w), "score": 1 - s} for (d, w), s in searched.items()])
    frame.to_csv(truth, index=False)
    assert "1.0," in truth.read_text()
    body = section(render_report(grid, ground_truth=truth), "weight-sharing")
    assert f"over the {len(searched)} architectures both have: Kendall tau -1.000" in body
    strings = tmp_path / "truth.jsonl"  # the decisions as strings
    strings.write_text("".join(json.dumps({"depth": str(d), "width": f"{w}.000", "acc": s}) + "\n"
                               for (d, w), s in searched.items()))
    body = section(render_report(grid, ground_truth=strings, ground_truth_metric="acc"), "weight-sharing")
    assert f"over the {len(searched)} architectures both have: Kendall tau +1.000" in body


def test_a_ground_truth_that_matches_nothing_says_so(grid: Path, tmp_path: Path) -> None:
    truth = tmp_path / "other.csv"
    truth.write_text("depth,width,score\n100,16,0.5\n200,32,0.6\n")
    body = section(render_report(grid, ground_truth=truth), "weight-sharing")
    notes = re.findall(r"<p class='na'>(.*?)</p>", body)
    assert len(notes) == 1 and "\n" not in notes[0]
    rows, count = nasplat.ExperimentResult.load(grid).rows, len(architectures(grid))
    config = min(rows, key=lambda r: r["trial_id"])["config"]
    assert notes[0] == (f"Ground truth {truth}: none of its 2 architectures is one of the {count} here (matched on "
                        f"[&#x27;depth&#x27;, &#x27;width&#x27;], numbers as numbers; e.g. here "
                        f"{{&#x27;depth&#x27;: {config['depth']}, &#x27;width&#x27;: {config['width']}}}, there "
                        f"{{&#x27;depth&#x27;: 100, &#x27;width&#x27;: 16}}): nothing to compare.")


# -- 5. a metric name that is not mathtext --------------------------------------------------------------------------
def test_a_metric_name_with_dollars_is_drawn_as_text(tmp_path: Path) -> None:
    nasplat.run(trainer="test_report_safety:Grid", space="test_report_safety:SPACE", metric=ODD_METRIC, mode="min",
                controller="random", seed=0, max_trials=4, max_steps=3, storage=tmp_path, name="odd")
    page = build_report(tmp_path / "odd").read_text()
    for name in ("best-so-far", "learning-curves"):
        svg = section(page, name)
        assert f'aria-label="{name}"' in svg
        assert re.search(r"<text[^>]*>\s*" + re.escape(ODD_METRIC) + r"\s*</text>", svg), name
    assert f"{ODD_METRIC} (min)" in section(page, "summary")


# -- 6. HTML in every field -----------------------------------------------------------------------------------------
def test_html_in_every_field_of_a_crafted_folder_stays_text(tmp_path: Path) -> None:
    """A folder written by hand, as anyone can: markup in the name, metric, controller, config keys and values,
    other metrics and errors is shown as text, never as markup."""
    tag = "<img src=x onerror=alert({})>"
    metric = tag.format("metric")
    folder = tmp_path / "crafted"
    folder.mkdir()
    (folder / "meta.json").write_text(json.dumps({"name": tag.format("name"), "metric": metric, "mode": "max",
                                                  "controller": tag.format("controller"),
                                                  "executor": tag.format("executor")}))
    rows = []
    for trial in range(4):
        for step in (1, 2):
            rows.append({"trial_id": trial, "step": step, "attempt": 0, "status": "completed" if trial else "failed",
                         "config": {tag.format("key"): tag.format(f"value{trial}"), "lr": 0.1 * (trial + 1)},
                         "parent_id": trial - 1 if trial > 1 else None, "donor_id": None, "start": trial,
                         "end": trial + step, "node": tag.format("node"), "pid": 1,
                         "error": tag.format("error") if not trial else None, metric: trial * step,
                         tag.format("other"): 1.0})
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = render_report(folder)
    for part in ("name", "metric", "controller", "executor", "key", "value1", "value3", "other", "node", "error"):
        assert tag.format(part) not in page, part
    assert "onerror" not in re.sub(r"&lt;img src=x onerror=alert\(\w+\)&gt;", "", page)
    assert "&lt;img src=x onerror=alert(metric)&gt;" in section(page, "summary")
    assert "&lt;img src=x onerror=alert(value3)&gt;" in section(page, "top")
