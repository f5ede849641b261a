"""The admin web page in a real browser: Debian's Chromium, headless, driven by Selenium
through the system's chromedriver (nothing is downloaded at run time).

One ``coordinator run`` process (admin server on loopback, a token file) and one browser
serve the whole module; each test makes its own jobs. A screenshot of each view is saved
under a directory printed at the start (``COORDINATOR_SCREENSHOTS`` chooses it).

Without the browser binaries the tests are skipped with a message, except under CI
(``CI`` set), where ``.ci/run`` installs them and a browser that cannot start fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import attrs
import pytest

from coordinator import buckets
from coordinator.admin.live import KEEP_ALIVE
from coordinator.admin.present import CURSOR_SHOWN
from coordinator.embedded import free_port
from coordinator.text import TRUNCATED
from tests.acceptance.test_cli import RUN_MAIN, sql
from tests.acceptance.test_operator import _environment, short_dir, wait_until
from tests.conftest import TEMPLATE, TestServer, _admin

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import (  # noqa: E402
    NoAlertPresentException,
    NoSuchElementException,
    StaleElementReferenceException,
    TimeoutException,
    WebDriverException,
)
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Iterator

TOKEN = "web-browser-test-token-" + os.urandom(8).hex()
XSS = "<script>alert(1)</script>"
CHROMIUM = ("chromium", "chromium-browser")
DRIVER = ("chromedriver",)
#: Seconds the idle page must stay silent (issue 15, item 6).
IDLE_WINDOW = 60.0


def say(request: pytest.FixtureRequest, line: str) -> None:
    """A line on the terminal, past pytest's output capture (paths, measurements)."""
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if capture is None or reporter is None:
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line(line)


def _find(names: tuple[str, ...], *extra: str) -> str | None:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return next((p for p in extra if Path(p).exists()), None)


# --------------------------------------------------------------------------- fixtures


@attrs.define(eq=False)
class Site:
    """The daemon process and the database behind the page."""

    url: str
    dsn: str
    dbname: str
    proc: subprocess.Popen[bytes]
    log: Path
    worker_socket: Path

    def define(self, name: str, namespace: str = "default", **kw: Any) -> int:
        args: dict[str, Any] = {"schedule_kind": "manual", **kw}
        args.setdefault("target", {"kind": "exec", "argv": ["true"]})
        args["target"] = json.dumps(args["target"])
        named = ", ".join(f"{k} => ${i + 3}" for i, k in enumerate(args))
        rows = sql(
            self.dsn,
            f"SELECT coordinator.define_job(name => $1, namespace => $2, {named}) AS id",
            name,
            namespace,
            *args.values(),
        )
        return int(rows[0]["id"])

    def runs_at(self, job_id: int, moments: list[datetime], status: str = "succeeded") -> None:
        sql(
            self.dsn,
            "INSERT INTO coordinator.runs (job_id, trigger, status, created_at, finished_at)"
            " SELECT $1, 'schedule', $2, t, t FROM unnest($3::timestamptz[]) t",
            job_id,
            status,
            moments,
        )

    def paused_run(self, job_id: int, cursor: Any, findings: list[dict[str, Any]]) -> int:
        """A paused run of ``job_id`` at ``cursor`` with ``findings`` (kind, resource_id,
        severity, detail; recorded in that order), written as the daemon writes them."""
        counts: dict[str, int] = {}
        for f in findings:
            counts[f["severity"]] = counts.get(f["severity"], 0) + 1
        rows = sql(
            self.dsn,
            "WITH r AS (INSERT INTO coordinator.runs (job_id, trigger, status, cursor, count,"
            " started_at, paused_at, last_progress_at, error_message, finding_counts)"
            " VALUES ($1, 'manual', 'paused', $2::text::jsonb, $3, now(), now(), now(),"
            " 'paused by operator', $4::text::jsonb) RETURNING id),"
            " f AS (INSERT INTO coordinator.findings (run_id, kind, resource_id, severity, detail)"
            " SELECT r.id, e.v->>'kind', e.v->>'resource_id', e.v->>'severity', e.v->'detail'"
            " FROM r, jsonb_array_elements($5::text::jsonb) WITH ORDINALITY AS e(v, n)"
            " ORDER BY e.n)"
            " SELECT id FROM r",
            job_id,
            json.dumps(cursor),
            len(findings),
            json.dumps(counts),
            json.dumps(findings),
        )
        return int(rows[0]["id"])


@pytest.fixture(scope="module")
def site(pg_server: TestServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    name = f"web{os.getpid()}"
    _admin(pg_server.admin_dsn, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    _admin(pg_server.admin_dsn, f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}")
    dsn = pg_server.dsn(name)
    home = tmp_path_factory.mktemp("web")
    token_file = home / "admin-token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    port = free_port()
    socket = short_dir() / "w.sock"
    config = home / "coordinator.toml"
    config.write_text(
        textwrap.dedent(f"""
        dsn = "{dsn}"
        state_dir = "{home / "state"}"
        worker_socket = "{socket}"
        admin_listen = "127.0.0.1:{port}"
        admin_token_file = "{token_file}"
        refresh_spacing = "0.2s"
        log_format = "json"
        """)
    )
    log = home / "daemon.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-c", RUN_MAIN, "run"],
            stdout=subprocess.DEVNULL,
            stderr=sink,
            env=_environment(config),
        )

    def ready() -> bool:
        assert proc.poll() is None, log.read_text()[-3000:]
        text = log.read_text()
        return '"event":"admin.listening"' in text and '"event":"ready"' in text

    try:
        wait_until(ready, timeout=60, what="the daemon's admin server")
        yield Site(
            url=f"http://127.0.0.1:{port}",
            dsn=dsn,
            dbname=name,
            proc=proc,
            log=log,
            worker_socket=socket,
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        _admin(pg_server.admin_dsn, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(scope="module")
def shots(request: pytest.FixtureRequest) -> Path:
    chosen = os.environ.get("COORDINATOR_SCREENSHOTS")
    path = Path(chosen) if chosen else Path(tempfile.mkdtemp(prefix="coordinator-screenshots-"))
    path.mkdir(parents=True, exist_ok=True)
    say(request, f"web page screenshots: {path}")
    return path


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    binary = _find(CHROMIUM, "/usr/bin/chromium")
    driver_path = _find(DRIVER, "/usr/bin/chromedriver")
    if binary is None or driver_path is None:
        missing = "chromium" if binary is None else "chromedriver"
        message = f"no {missing}: apt-get install -y chromium chromium-driver"
        if os.environ.get("CI"):
            pytest.fail(f"{message} (.ci/run installs them)")
        pytest.skip(message)
    profile = tempfile.mkdtemp(prefix="coordinator-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for argument in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(argument)
    # Every request the page makes (navigations, fetches, the event stream) is logged.
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    try:
        driver = webdriver.Chrome(
            options=options, service=webdriver.ChromeService(executable_path=driver_path)
        )
    except WebDriverException as exc:
        pytest.fail(f"Chromium did not start: {str(exc).splitlines()[0]}")
    driver.set_script_timeout(15)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@attrs.define(eq=False)
class Page:
    """The browser on the site, signed in, with every URL it asked for."""

    driver: Any
    site: Site
    shots: Path
    urls: list[str] = attrs.field(factory=list)
    #: Each request's URL by its id, and the URL of each chunk of a body received.
    ids: dict[str, str] = attrs.field(factory=dict)
    chunks: list[str] = attrs.field(factory=list)

    def requested(self) -> list[str]:
        """URLs requested since the last call (from Chromium's network log)."""
        found = []
        for entry in self.driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            params = message.get("params", {})
            if message.get("method") == "Network.requestWillBeSent":
                found.append(params["request"]["url"])
                self.ids[params["requestId"]] = params["request"]["url"]
            elif message.get("method") == "Network.dataReceived":
                self.chunks.append(self.ids.get(params["requestId"], ""))
        self.urls += found
        return found

    def go(self, path: str) -> None:
        self.driver.get(self.site.url + path)
        self.wait(lambda d: d.execute_script("return document.readyState") == "complete")

    def wait(self, condition: Any, timeout: float = 15, what: str = "") -> Any:
        try:
            return WebDriverWait(
                self.driver,
                timeout,
                poll_frequency=0.05,
                ignored_exceptions=(StaleElementReferenceException, NoSuchElementException),
            ).until(condition)
        except TimeoutException:
            raise AssertionError(
                f"timed out waiting for {what or condition}; page:\n"
                + self.driver.page_source[:3000]
            ) from None

    def live(self) -> None:
        """Wait until the page follows the event stream."""
        self.wait(
            lambda d: "on" in d.find_element(By.ID, "live").get_attribute("class"), what="live"
        )

    def click(self, selector: str) -> None:
        """Click what ``selector`` finds (again, if a live refresh replaced it meanwhile)."""

        def clicked(d: Any) -> bool:
            d.find_element(By.CSS_SELECTOR, selector).click()
            return True

        self.wait(clicked, what=f"to click {selector}")

    def css(self, selector: str) -> Any:
        return self.driver.find_element(By.CSS_SELECTOR, selector)

    def all(self, selector: str) -> list[Any]:
        return list(self.driver.find_elements(By.CSS_SELECTOR, selector))

    def shot(self, name: str) -> Path:
        path = self.shots / f"{name}.png"
        self.driver.save_screenshot(str(path))
        return path

    def mark(self) -> None:
        """Remember this document: :meth:`same_document` tells whether it was reloaded."""
        self.driver.execute_script("window.__coordinatorMark = 'kept';")

    def same_document(self) -> bool:
        return self.driver.execute_script("return window.__coordinatorMark") == "kept"

    def row(self, job_id: int) -> Any:
        return self.css(f'tr[data-job="{job_id}"]')


@contextlib.contextmanager
def worker_process(site: Site, home: Path, module: str, source: str) -> Iterator[None]:
    """``coordinator worker <module>:worker`` on the site's socket while the block runs."""
    (home / f"{module}.py").write_text(textwrap.dedent(source))
    env = {**_environment(None), "PYTHONPATH": str(home)}
    worker = subprocess.Popen(
        [sys.executable, "-c", RUN_MAIN, "worker", f"{module}:worker",
         "--socket", str(site.worker_socket)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(10)
        except subprocess.TimeoutExpired:
            worker.kill()


@pytest.fixture(scope="module")
def page(browser: Any, site: Site, shots: Path) -> Iterator[Page]:
    p = Page(driver=browser, site=site, shots=shots)
    p.go("/")
    assert p.driver.current_url == site.url + "/signin"
    p.shot("signin")
    p.css("#token").send_keys(TOKEN)
    p.css("section.signin button[type=submit]").click()
    p.wait(lambda d: d.current_url == site.url + "/", what="the jobs page after signing in")
    yield p
    # Whatever the tests did: the token never appeared in a URL the browser asked for.
    p.requested()
    assert p.urls
    assert not [u for u in p.urls if TOKEN in u]


# --------------------------------------------------------------------------- tests


def test_sign_in_and_the_jobs_table_lists_the_jobs(page: Page, site: Site) -> None:
    # Paused: the module's daemon must stay idle (the last test counts its statements).
    site.define(
        "backup-db",
        schedule_kind="cron",
        schedule="30 2 * * *",
        timezone="Europe/Berlin",
        paused=True,
    )
    site.define("reports", namespace="ops", schedule_kind="cron", schedule="0 0 1 1 *")
    site.define("thumbnails", target={"kind": "worker", "type": "images"})
    page.go("/")
    page.live()
    names = [e.text for e in page.all("table.jobs td.name")]
    assert {"backup-db", "reports", "thumbnails"} <= set(names)
    text = page.css("table.jobs").text
    assert "at 02:30 Europe/Berlin" in text
    assert "waiting for a worker serving images" in text
    assert TOKEN not in page.driver.page_source
    cookies = {c["name"]: c for c in page.driver.get_cookies()}
    session = cookies["coordinator_session"]
    assert session["httpOnly"] is True
    assert session["sameSite"] == "Strict"
    assert TOKEN not in session["value"]
    page.shot("jobs")


def test_click_run_and_the_new_run_appears_without_a_reload(page: Page, site: Site) -> None:
    job_id = site.define("click-me", target={"kind": "exec", "argv": ["sh", "-c", "echo clicked"]})
    page.go("/jobs/default/click-me")
    page.live()
    assert page.all("tbody[data-runs-of] tr.none")  # no runs yet
    page.mark()
    page.click(".job-head form[action$='/run'] button")
    row = page.wait(
        lambda d: d.find_elements(By.CSS_SELECTOR, "tbody[data-runs-of] tr[data-run]"),
        what="the new run's row",
    )[0]
    run_id = int(row.get_attribute("data-run"))
    page.wait(
        lambda d: "succeeded" in d.find_element(By.CSS_SELECTOR, f'tr[data-run="{run_id}"]').text,
        what="the run to succeed",
    )
    page.wait(
        lambda d: d.find_elements(
            By.CSS_SELECTOR, f'.job-head a.s-succeeded[href="/runs/{run_id}"]'
        ),
        what="the job's last run in its summary",
    )
    assert page.same_document()
    page.shot("job")
    # The jobs table follows too: the row's last run changes in place.
    page.go("/")
    page.live()
    page.mark()
    page.click(f"tr[data-job='{job_id}'] form[action$='/run'] button")
    page.wait(
        lambda d: (
            d.find_element(By.CSS_SELECTOR, f'tr[data-job="{job_id}"] a.pill')
            .get_attribute("href")
            .endswith(f"/runs/{run_id + 1}")
        ),
        what="the row's last run to be the new run",
    )
    assert page.same_document()
    # The run's detail shows its output.
    page.go(f"/runs/{run_id}")
    assert "clicked" in page.css("section.output").text
    page.shot("run-finished")


def test_pause_and_resume_without_a_reload(page: Page, site: Site) -> None:
    job_id = site.define("pausable", schedule_kind="cron", schedule="0 0 1 1 *")
    page.go("/")
    page.live()
    page.mark()

    def state(d: Any) -> str:
        return str(d.find_element(By.CSS_SELECTOR, f'tr[data-job="{job_id}"] .state').text)

    page.click(f"tr[data-job='{job_id}'] form[action$='/pause'] button")
    page.wait(lambda d: state(d) == "paused", what="paused")
    assert page.css("#toast").get_attribute("textContent") == "default/pausable paused"
    page.click(f"tr[data-job='{job_id}'] form[action$='/resume'] button")
    page.wait(lambda d: state(d) == "active", what="active again")
    page.wait(
        lambda d: d.find_elements(
            By.CSS_SELECTOR, f"tr[data-job='{job_id}'] form[action$='/pause']"
        ),
        what="a Pause button again",
    )
    assert page.same_document()
    rows = sql(site.dsn, "SELECT paused FROM coordinator.jobs WHERE id = $1", job_id)
    assert rows[0]["paused"] is False


def test_a_change_to_several_jobs_reads_the_table_once_not_each_row(page: Page, site: Site) -> None:
    """The table and every row in it were fetched: 101 requests (and connections) per
    open page for a change to two jobs, or a worker connecting."""
    for name in ("bulk-a", "bulk-b"):
        site.define(name, paused=True)  # (paused: the module's daemon stays idle)
    page.go("/")
    page.live()
    assert len(page.all("table.jobs tbody tr[data-job]")) >= 2
    page.requested()
    sql(
        site.dsn,
        "UPDATE coordinator.jobs SET timeout = interval '5 min' WHERE name IN ('bulk-a', 'bulk-b')",
    )
    seen: list[str] = []

    def table_read(_d: Any) -> bool:
        seen.extend(page.requested())
        return any("/ui/jobs-table" in url for url in seen)

    page.wait(table_read, what="the table read again")
    time.sleep(0.5)  # (rows would have been asked for in the same turn as the table)
    seen.extend(page.requested())
    assert [url for url in seen if "/ui/job-row/" in url] == []


def test_a_long_name_wraps_and_leaves_every_rows_buttons_in_view(page: Page, site: Site) -> None:
    """A 200-character name took the whole width: every row's schedule, runs and buttons
    sat behind a horizontal scrollbar, and the header's "next:" ran off the page (a
    tester's finding). Nothing may reach past the window's right edge."""
    site.define("L" * 200, schedule_kind="interval", schedule="1h")
    site.define("short", schedule_kind="cron", schedule="0 0 1 1 *")
    page.driver.set_window_size(1400, 900)

    def overflowing() -> list[str]:
        found: list[str] = page.driver.execute_script(
            "return Array.from(document.querySelectorAll('body *'))"
            ".filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)"
            ".map(e => e.tagName + '.' + e.className);"
        )
        return found

    for path in ("/", "/jobs/default/" + "L" * 200):
        page.go(path)
        assert overflowing() == [], path


def test_a_job_removed_while_its_page_is_open_says_so(page: Page, site: Site) -> None:
    """The live update stripped the title, details and buttons and kept the runs table,
    with no word of why (a tester's finding)."""
    job_id = site.define("leaving", schedule_kind="cron", schedule="0 0 1 1 *")
    page.go("/jobs/default/leaving")
    page.live()
    page.mark()
    sql(site.dsn, "SELECT coordinator.remove('default', 'leaving')")
    note = page.wait(
        lambda d: d.find_elements(By.CSS_SELECTOR, f'p.note[data-gone="{job_id}"]'),
        what="the removed job's notice",
    )[0]
    assert note.text.startswith("This job was removed")
    assert note.find_element(By.TAG_NAME, "a").get_attribute("href").endswith("/")
    assert page.same_document()


@pytest.mark.parametrize(("span", "days", "unit"), [("2d", 2, "hour"), ("6mo", 183, "week")])
def test_sparkline_has_the_right_buckets(
    page: Page, site: Site, span: str, days: int, unit: str
) -> None:
    job_id = site.define(f"history-{span}")
    now = datetime.now(UTC)
    moments = [now - timedelta(days=days) * (i + 0.5) / 40 for i in range(40)]
    site.runs_at(job_id, moments[::2])
    site.runs_at(job_id, moments[1::2], "failed")
    page.go(f"/jobs/default/history-{span}?span={span}")
    chart = page.css(".spark-big svg.spark")
    assert chart.get_attribute("data-unit") == unit
    since = datetime.fromisoformat(chart.get_attribute("data-since"))
    until = datetime.fromisoformat(chart.get_attribute("data-until"))
    assert abs((until - since) - timedelta(days=days)) < timedelta(seconds=2)
    expected = buckets.choose(since, until)
    groups = chart.find_elements(By.CSS_SELECTOR, ".bucket")
    assert len(groups) == expected.count == int(chart.get_attribute("data-count"))
    assert buckets.MIN_BUCKETS <= len(groups) <= buckets.MAX_BUCKETS
    assert chart.get_attribute("data-step") == str(expected.step)
    totals = sum(int(g.get_attribute("data-total") or 0) for g in groups)
    assert totals == 40
    assert chart.find_elements(By.CSS_SELECTOR, "rect.s-failed")
    page.shot(f"sparkline-{span}")


def test_a_runs_detail_shows_its_progress_live(page: Page, site: Site, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    source = f"""
        from pathlib import Path
        import trio
        from coordinator.worker import Worker

        worker = Worker(capacity=1)
        GATE = Path({str(gate)!r})

        @worker.job("slow-copy")
        async def copy(ctx):
            await ctx.progress(40, step="copying", message="file 4 of 10")
            while not (GATE / "half").exists():
                await trio.sleep(0.05)
            await ctx.progress(80, step="checking", message="almost there")
            while not (GATE / "done").exists():
                await trio.sleep(0.05)
            return {{"count": 10}}
        """
    with worker_process(site, tmp_path, "web_worker", source):
        site.define("copy", target={"kind": "worker", "type": "slow-copy"})
        page.go("/status")
        page.live()
        page.wait(lambda d: "slow-copy" in d.find_element(By.CSS_SELECTOR, "section.status").text,
                  what="the worker on the status page")  # fmt: skip
        page.shot("status")
        run_id = int(sql(site.dsn, "SELECT coordinator.trigger('default', 'copy') AS id")[0]["id"])
        page.go(f"/runs/{run_id}")
        page.live()
        page.mark()

        def bar(d: Any) -> tuple[str | None, str]:
            box = d.find_element(By.CSS_SELECTOR, f'[data-progress-run="{run_id}"]')
            value = box.find_element(By.TAG_NAME, "progress").get_attribute("value")
            return value, box.text

        page.wait(lambda d: bar(d)[0] == "40", what="40 %")
        assert "copying" in bar(page.driver)[1]
        assert "file 4 of 10" in bar(page.driver)[1]
        page.shot("run-progress")
        (gate / "half").touch()
        page.wait(lambda d: bar(d)[0] == "80", what="80 % without a reload")
        assert "almost there" in bar(page.driver)[1]
        assert page.same_document()
        (gate / "done").touch()
        page.wait(
            lambda d: "succeeded" in d.find_element(By.CSS_SELECTOR, "article.run h1").text,
            what="the run to succeed",
        )
        assert page.same_document()
        assert "checking" in page.css("section.progress").text  # the final snapshot


#: A recoverable scan over 60 rows, ten a batch, each row a finding (severities in
#: turn); it waits after 30 rows until GATE/go exists, and pauses when asked. Each call
#: leaves GATE/start-<the cursor it was handed>.
SCAN_WORKER = """
    from pathlib import Path
    import trio
    from coordinator.worker import Paused, Worker

    worker = Worker(capacity=1)
    GATE = Path({gate!r})
    SEVERITIES = ("info", "warning", "error", "data_loss")

    @worker.job("web-scan")
    async def scan(ctx):
        (GATE / f"start-{{ctx.cursor}}").touch()
        position = ctx.cursor or 0
        while position < 60:
            if ctx.cancelled.is_set():
                raise Paused()
            if position >= 30 and not (GATE / "go").exists():
                await trio.sleep(0.05)
                continue
            for row in range(position, position + 10):
                await ctx.finding("check", f"row-{{row}}", severity=SEVERITIES[row % 4],
                                  detail={{"row": row}})
            position += 10
            await ctx.checkpoint(position, count=10)
    """


def test_pause_and_resume_a_recoverable_run_and_see_its_findings(
    page: Page, site: Site, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    with worker_process(site, tmp_path, "scan_worker", SCAN_WORKER.format(gate=str(gate))):
        job_id = site.define(
            "table-scan", target={"kind": "worker", "type": "web-scan"}, recoverable=True
        )
        run_id = int(
            sql(site.dsn, "SELECT coordinator.trigger('default', 'table-scan') AS id")[0]["id"]
        )

        def cursor() -> Any:
            rows = sql(site.dsn, "SELECT cursor::text FROM coordinator.runs WHERE id = $1", run_id)
            return rows[0]["cursor"]

        wait_until(lambda: cursor() == "30", timeout=30, what="the scan to wait at row 30")
        page.go(f"/runs/{run_id}")
        page.live()
        assert "running" in page.css("article.run h1").text
        assert page.css("section.recovery pre.cursor").text == "30"
        page.mark()

        page.click(f"article.run form[action='/runs/{run_id}/pause'] button")
        page.wait(
            lambda d: "paused" in d.find_element(By.CSS_SELECTOR, "article.run h1").text,
            what="the run to be paused",
        )
        assert page.same_document()
        recovery = page.css("section.recovery")
        assert recovery.find_element(By.CSS_SELECTOR, "pre.cursor").text == "30"
        assert recovery.find_element(By.CSS_SELECTOR, ".counted").text == "30"
        assert "paused by operator" in recovery.text
        assert page.all(f"article.run form[action='/runs/{run_id}/resume'] button")
        assert not page.all(f"article.run form[action='/runs/{run_id}/pause']")
        page.shot("run-paused")

        # The jobs view: which run is paused, since when, and a Resume button.
        page.go("/")
        page.live()
        outstanding = page.row(job_id).find_element(By.CSS_SELECTOR, ".outstanding")
        assert re.match(
            rf"run {run_id} paused at (\d{{4}}-\d\d-\d\d )?\d\d:\d\d UTC,\sResume", outstanding.text
        )
        assert outstanding.find_elements(By.CSS_SELECTOR, "form[action$='/resume'] button")
        page.shot("jobs-run-paused")

        # Resume from the run's page: the same run goes on from row 30 to the end.
        page.go(f"/runs/{run_id}")
        page.live()
        page.mark()
        (gate / "go").touch()
        page.click(f"article.run form[action='/runs/{run_id}/resume'] button")
        page.wait(
            lambda d: "succeeded" in d.find_element(By.CSS_SELECTOR, "article.run h1").text,
            what="the resumed run to succeed",
        )
        assert page.same_document()
        assert page.css("section.recovery .resumes").text == "1"
        assert page.css("section.recovery .counted").text == "60"
        runs = sql(site.dsn, "SELECT count(*) AS n FROM coordinator.runs WHERE job_id = $1", job_id)
        assert runs[0]["n"] == 1
        # The resumed call was handed the cursor the pause saved (not a fresh start).
        assert sorted(p.name for p in gate.glob("start-*")) == ["start-30", "start-None"]

    # The findings, newest first, with their severities; then one severity only.
    rows = page.all("table.findings tbody tr[data-finding]")
    assert len(rows) == 25
    ids = [int(r.get_attribute("data-finding")) for r in rows]
    assert ids == sorted(ids, reverse=True)
    assert rows[0].find_element(By.CSS_SELECTOR, "td.resource").text == "row-59"
    shown = {r.find_element(By.CSS_SELECTOR, ".sev").text for r in rows}
    assert shown == {"info", "warning", "error", "data loss"}
    page.driver.execute_script("document.getElementById('findings').scrollIntoView()")
    page.shot("run-findings")
    # The next page: older findings, still newest first.
    page.click("section.findings nav.pages a[href*='findings_before']")
    page.wait(lambda d: "findings_before=" in d.current_url, what="the older findings")
    older = [int(r.get_attribute("data-finding")) for r in page.all("tr[data-finding]")]
    assert len(older) == 25
    assert older == sorted(older, reverse=True)
    assert max(older) < min(ids)
    assert page.all(f"section.findings nav.pages a[href$='/runs/{run_id}#findings']")
    page.click("nav.severities a.sev-data_loss")
    page.wait(lambda d: "severity=data_loss" in d.current_url, what="the data loss filter")
    rows = page.all("table.findings tbody tr[data-finding]")
    assert len(rows) == 15
    assert {r.find_element(By.CSS_SELECTOR, ".sev").text for r in rows} == {"data loss"}
    page.shot("run-findings-data-loss")


def test_a_retried_jobs_attempts_and_a_waiting_retry(
    page: Page, site: Site, tmp_path: Path
) -> None:
    calls = tmp_path / "calls"
    flaky = site.define(
        "flaky",
        target={
            "kind": "exec",
            "argv": ["sh", "-c", f'echo x >> {calls}; [ "$COORDINATOR_ATTEMPT" -ge 3 ]'],
        },
        retries=3,
        retry_backoff=timedelta(milliseconds=200),
    )
    page.go("/jobs/default/flaky")
    page.live()
    page.mark()
    assert "3 retries, after 200 ms doubling to at most 1 h" in page.css(".job-head").text
    page.click(".job-head form[action$='/run'] button")

    def attempts(d: Any) -> list[str]:
        return [r.text for r in d.find_elements(By.CSS_SELECTOR, "tbody[data-runs-of] tr")]

    page.wait(
        lambda d: len(attempts(d)) == 3 and "succeeded" in attempts(d)[0],
        what="three attempts, the last one succeeded",
    )
    assert page.same_document()
    first, second, third = reversed(attempts(page.driver))
    assert "failed" in first
    assert "failed" in second
    assert "attempt 2" in second
    assert "attempt 3" in third
    page.shot("job-attempts")

    page.click("tbody[data-runs-of] tr:first-child td:first-child a")
    page.wait(lambda d: d.find_elements(By.CSS_SELECTOR, "table.chain"), what="the chain")
    chain = page.all("table.chain tbody tr.attempt")
    assert [r.find_element(By.CSS_SELECTOR, "td").text for r in chain] == ["1", "2", "3"]
    assert [len(r.find_elements(By.CSS_SELECTOR, "a")) for r in chain] == [1, 1, 0]
    assert "unknown" in chain[0].text  # a failed command's category
    assert "succeeded" in chain[2].text
    page.shot("run-attempts")
    chain[0].find_element(By.CSS_SELECTOR, "a").click()
    page.wait(lambda d: "Retried by" in d.find_element(By.CSS_SELECTOR, "article.run").text,
              what="the first attempt's detail")  # fmt: skip
    rows = sql(site.dsn, "SELECT count(*) AS n FROM coordinator.runs WHERE job_id = $1", flaky)
    assert rows[0]["n"] == 3

    # A retry waiting for its due time (an hour's backoff): the jobs view says which, when.
    patient = site.define(
        "patient", target={"kind": "exec", "argv": ["false"]}, retries=4,
        retry_backoff=timedelta(hours=1), misfire="skip", misfire_grace=timedelta(minutes=10),
    )  # fmt: skip
    page.go("/")
    page.live()
    page.mark()
    sql(site.dsn, "SELECT coordinator.trigger('default', 'patient')")
    page.wait(
        lambda d: "retry 1 of 4 due in" in page.row(patient).text,
        what="the waiting retry in the jobs view, without a reload",
    )
    assert page.same_document()
    page.shot("jobs-retry-waiting")
    page.go("/jobs/default/patient")
    head = page.css(".job-head").text
    assert "retry 1 of 4 due in" in head
    assert "skip if more than 10 min late" in head
    page.shot("job-retry-policy")


def test_a_job_named_like_a_script_is_shown_as_text(page: Page, site: Site) -> None:
    job_id = site.define(XSS)
    page.go("/")
    cell = page.row(job_id).find_element(By.CSS_SELECTOR, "td.name")
    assert cell.text == XSS
    with pytest.raises(NoAlertPresentException):
        page.driver.switch_to.alert  # noqa: B018 - raises when no alert is open
    page.go(f"/jobs/default/{XSS.replace('/', '%2F')}")
    assert page.css(".job-head h1").text.startswith(XSS)
    with pytest.raises(NoAlertPresentException):
        page.driver.switch_to.alert  # noqa: B018


def test_a_runs_cursor_and_findings_are_shown_as_text_with_their_severity(
    page: Page, site: Site
) -> None:
    job_id = site.define("audit", target={"kind": "worker", "type": "web-audit"}, recoverable=True)
    severities = ("info", "warning", "error", "data_loss")
    findings = [
        {"kind": "orphan", "resource_id": f"row-{i}", "severity": severities[i % 4],
         "detail": {"i": i}}
        for i in range(30)
    ]  # fmt: skip
    newest = {"kind": XSS, "resource_id": XSS, "severity": "data_loss", "detail": {"x": XSS}}
    findings.append(newest)
    cursor = {"after": XSS, "pad": "y" * 5000}  # 5 kB: more than the page shows
    run_id = site.paused_run(job_id, cursor, findings)
    page.go(f"/runs/{run_id}")
    page.live()
    with pytest.raises(NoAlertPresentException):
        page.driver.switch_to.alert  # noqa: B018 - raises when no alert is open
    # Only the page's own script: nothing a worker sent became an element.
    inline = "return [...document.scripts].filter(s => !s.src).length"
    assert page.driver.execute_script(inline) == 0
    assert page.driver.execute_script("return document.querySelectorAll('b, i, img').length") == 0

    row = page.css("table.findings tbody tr[data-finding]")
    cells = [c.text for c in row.find_elements(By.CSS_SELECTOR, "td")]
    assert cells[:3] == ["data loss", XSS, XSS]
    assert cells[3] == json.dumps({"x": XSS})
    assert row.find_element(By.CSS_SELECTOR, ".sev").get_attribute("class") == ("sev sev-data_loss")
    counts = page.css("nav.severities").text
    assert "all 31" in counts
    assert "data loss 8" in counts
    assert "warning 8" in counts

    shown = page.css("section.recovery pre.cursor").text
    assert XSS in shown  # as text
    assert len(shown) <= CURSOR_SHOWN + len(TRUNCATED)
    assert "y" * 2000 not in shown
    size = len(json.dumps(cursor, separators=(",", ":")).encode())
    assert f"{size} bytes, the first {CURSOR_SHOWN} characters shown" in (
        page.css("section.recovery").text
    )
    assert page.all(f"article.run form[action='/runs/{run_id}/resume'] button")
    page.shot("run-findings-escaped")


def test_a_post_without_the_csrf_token_is_refused(page: Page, site: Site) -> None:
    site.define("forged")
    page.go("/")
    answers = page.driver.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        const post = (body) => fetch('/jobs/default/forged/run', {
            method: 'POST', credentials: 'same-origin', body: new URLSearchParams(body),
            headers: {'X-Requested-With': 'fetch'}}).then(r => r.status);
        Promise.all([post({}), post({csrf: 'forged'})]).then(done, e => done(String(e)));
        """
    )
    assert answers == [403, 403]
    runs = sql(
        site.dsn,
        "SELECT count(*) AS n FROM coordinator.runs r JOIN coordinator.jobs j ON j.id = r.job_id"
        " WHERE j.name = 'forged'",
    )
    assert runs[0]["n"] == 0


def test_usable_on_a_phone(page: Page) -> None:
    page.driver.set_window_size(390, 844)
    try:
        page.go("/")
        assert page.css("table.jobs").is_displayed()
        width = page.driver.execute_script("return document.documentElement.scrollWidth")
        assert width <= 400  # the table scrolls inside its box, not the page
        page.shot("jobs-phone")
    finally:
        page.driver.set_window_size(1280, 900)


def test_the_page_weight(page: Page, request: pytest.FixtureRequest) -> None:
    """HTML + JS + CSS of the jobs view as served (reported; the script and the
    stylesheet must stay small)."""
    page.go("/")
    html, script, style = page.driver.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        Promise.all(['/', '/static/app.js', '/static/app.css'].map(
            u => fetch(u, {credentials: 'same-origin'}).then(r => r.arrayBuffer())
                 .then(b => b.byteLength))).then(done, e => done([String(e), 0, 0]));
        """
    )
    jobs = len(page.all("table.jobs tbody tr[data-job]"))
    line = (
        f"page weight of the jobs view ({jobs} jobs): HTML {html} + JS {script} + CSS {style}"
        f" = {html + script + style} bytes"
    )
    (page.shots / "page-weight.txt").write_text(line + "\n")
    say(request, line)
    assert 0 < script + style < 40_000


def test_choosing_the_span_keeps_the_page_and_a_filter_does_not(page: Page, site: Site) -> None:
    """The "Runs over" span on page 2 went back to page 1 (a tester's finding): the span lists
    the same jobs, only their sparklines change. A filter still starts at page 1."""
    sql(
        site.dsn,
        "SELECT coordinator.define_job(name => 'paged-' || lpad(i::text, 3, '0'),"
        " namespace => 'paging', schedule_kind => 'manual',"
        ' target => \'{"kind": "exec", "argv": ["true"]}\')'
        " FROM generate_series(1, 105) i",
    )
    page.go("/?namespace=paging&q=paged-&page=2")
    assert "page 2 of 2" in page.css("nav.pages").text
    page.mark()

    def choose(name: str, value: str) -> None:
        select = page.css(f'form.filters select[name="{name}"]')
        page.driver.execute_script(
            "arguments[0].value = arguments[1];"
            " arguments[0].dispatchEvent(new Event('change', {bubbles: true}));",
            select,
            value,
        )
        page.wait(lambda _d: not page.same_document(), what="the page chosen")
        page.wait(lambda d: d.execute_script("return document.readyState") == "complete")
        page.mark()

    choose("span", "30d")
    asked = parse_qs(urlsplit(page.driver.current_url).query, keep_blank_values=True)
    assert (asked["page"], asked["q"], asked["namespace"], asked["span"]) == (
        ["2"], ["paged-"], ["paging"], ["30d"],
    )  # fmt: skip
    assert "page 2 of 2" in page.css("nav.pages").text
    assert page.css("table.jobs tbody tr[data-job] td.name").text == "paged-101"
    choose("namespace", "")
    asked = parse_qs(urlsplit(page.driver.current_url).query, keep_blank_values=True)
    assert "page" not in asked
    assert (asked["namespace"], asked["q"], asked["span"]) == ([""], ["paged-"], ["30d"])
    assert "page 1 of 2" in page.css("nav.pages").text


@pytest.mark.slow
def test_an_open_page_sends_no_sql_for_a_minute(
    page: Page, site: Site, sql_log: Any, pg_server: TestServer
) -> None:
    job_id = site.define("someday", schedule_kind="cron", schedule="0 0 1 1 *")
    # A second tab, open on the same window: a paused recoverable run's detail (cursor,
    # findings, Resume), which follows the stream for its run and its job.
    scan = site.define("someday-scan", target={"kind": "worker", "type": "web-idle"},
                       recoverable=True)  # fmt: skip
    finding = {"kind": "gap", "resource_id": "row-1", "severity": "warning", "detail": {}}
    run_id = site.paused_run(scan, {"after": 1}, [finding])
    page.go("/")
    page.live()
    page.mark()
    jobs_tab = page.driver.current_window_handle
    page.driver.switch_to.new_window("tab")
    try:
        page.go(f"/runs/{run_id}")
        page.live()
        page.mark()
        assert page.all("section.findings tr[data-finding]")
        time.sleep(1.0)  # let the refresh the definitions asked for land
        page.requested()
        page.chunks.clear()
        sql_log.mark()
        time.sleep(IDLE_WINDOW)
        statements = sql_log.statements(db=site.dbname)
        assert statements == [], [s.sql[:200] for s in statements]
        # The pages stayed connected all along: no new request, no reconnect of a stream.
        assert page.requested() == []
        # Yet the streams were not silent: keep-alive comments (a proxy's idle timeout
        # dropped a silent one), which cost no SQL and no read.
        keep_alives = [url for url in page.chunks if url.endswith("/ui/events")]
        assert len(keep_alives) >= IDLE_WINDOW // KEEP_ALIVE, page.chunks
        assert "on" in page.css("#live").get_attribute("class")
        # The count means something: one event later, the run's page reads what it names.
        sql(site.dsn, "SELECT coordinator.cancel($1)", run_id)
        page.wait(
            lambda d: "cancelled" in d.find_element(By.CSS_SELECTOR, "article.run h1").text,
            what="the cancelled run's detail",
        )
        assert page.same_document()
    finally:
        page.driver.close()
        page.driver.switch_to.window(jobs_tab)
    assert "on" in page.css("#live").get_attribute("class")
    # And the jobs view, open all along, follows too.
    sql(site.dsn, "SELECT coordinator.pause('default', 'someday')")
    page.wait(
        lambda d: (
            d.find_element(By.CSS_SELECTOR, f'tr[data-job="{job_id}"] .state').text == "paused"
        ),
        what="the paused job's row",
    )
    assert page.same_document()
    assert sql_log.statements(app="coordinator-admin", db=site.dbname)
