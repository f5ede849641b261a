"""The notify protocol against real datagram sockets, and the watchdog on trio's clock."""

from __future__ import annotations

import os
import re
import socket
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
import trio
import trio.testing

from coordinator import config
from coordinator.systemd import Notifier, watchdog, watchdog_interval

MakeNotifier = Callable[[Mapping[str, str]], Notifier]


def _receive_all(sock: socket.socket) -> list[bytes]:
    """Everything queued on a non-blocking receiver, in order."""
    out: list[bytes] = []
    while True:
        try:
            out.append(sock.recv(65536))
        except BlockingIOError:
            return out


@pytest.fixture
def make_notifier() -> Iterator[MakeNotifier]:
    """``Notifier.from_environment``, with every notifier closed at teardown."""
    made: list[Notifier] = []

    def make(environ: Mapping[str, str]) -> Notifier:
        made.append(Notifier.from_environment(environ))
        return made[-1]

    yield make
    for notifier in made:
        notifier.close()


@pytest.fixture
def path_receiver(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = tmp_path / "notify"
    sock.bind(str(path))
    sock.setblocking(False)
    with sock:
        yield sock, str(path)


@pytest.fixture
def abstract_receiver() -> Iterator[tuple[socket.socket, str]]:
    name = f"coordinator-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.setblocking(False)
    with sock:
        yield sock, "@" + name


@pytest.fixture(params=["path", "abstract"])
def receiver(
    request: pytest.FixtureRequest,
) -> tuple[socket.socket, str]:
    fixture = "path_receiver" if request.param == "path" else "abstract_receiver"
    value: tuple[socket.socket, str] = request.getfixturevalue(fixture)
    return value


# -- Notifier ---------------------------------------------------------------------------


def test_state_messages_arrive_byte_exact(
    make_notifier: MakeNotifier, receiver: tuple[socket.socket, str]
) -> None:
    sock, address = receiver
    notify = make_notifier({"NOTIFY_SOCKET": address})
    try:
        notify("READY=1")
        notify("STATUS=leader: 3 armed, next 2030-01-01T00:00:00+00:00, 0 running — ok")
        notify("EXTEND_TIMEOUT_USEC=90000000")
        notify("STOPPING=1")
        notify("READY=1\nSTATUS=two lines")
    finally:
        notify.close()
    assert _receive_all(sock) == [
        b"READY=1",
        "STATUS=leader: 3 armed, next 2030-01-01T00:00:00+00:00, 0 running — ok".encode(),
        b"EXTEND_TIMEOUT_USEC=90000000",
        b"STOPPING=1",
        b"READY=1\nSTATUS=two lines",
    ]
    assert (notify.sent, notify.failures) == (5, 0)


def test_abstract_name_gets_a_leading_nul(make_notifier: MakeNotifier) -> None:
    notify = make_notifier({"NOTIFY_SOCKET": "@sd/notify"})
    notify.close()
    assert notify.address == "\0sd/notify"


@pytest.mark.parametrize("environ", [{}, {"NOTIFY_SOCKET": ""}, {"NOTIFY_SOCKET": "vsock:2:9"}])
def test_without_a_notify_socket_every_call_is_a_noop(
    make_notifier: MakeNotifier, environ: dict[str, str]
) -> None:
    notify = make_notifier(environ)
    assert notify.address is None
    notify("READY=1")
    notify("STOPPING=1")
    notify.close()
    assert (notify.sent, notify.failures) == (0, 0)


def test_default_environment_is_os_environ(
    monkeypatch: pytest.MonkeyPatch, path_receiver: tuple[socket.socket, str]
) -> None:
    sock, address = path_receiver
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    notify = Notifier.from_environment()
    try:
        notify("READY=1")
    finally:
        notify.close()
    assert _receive_all(sock) == [b"READY=1"]


def test_missing_receiver_is_counted_not_raised(
    make_notifier: MakeNotifier, tmp_path: Path
) -> None:
    notify = make_notifier({"NOTIFY_SOCKET": str(tmp_path / "gone")})
    notify("READY=1")
    notify.close()
    assert (notify.sent, notify.failures) == (0, 1)


def test_full_receiver_queue_neither_blocks_nor_raises(
    make_notifier: MakeNotifier,
    path_receiver: tuple[socket.socket, str],
) -> None:
    sock, address = path_receiver
    notify = make_notifier({"NOTIFY_SOCKET": address})
    for _ in range(5000):  # far beyond net.unix.max_dgram_qlen; a blocking send would hang
        notify("STATUS=nobody reads this")
    notify.close()
    assert notify.failures > 0
    assert notify.sent == len(_receive_all(sock))


def test_calls_after_close_are_noops(
    make_notifier: MakeNotifier, path_receiver: tuple[socket.socket, str]
) -> None:
    sock, address = path_receiver
    notify = make_notifier({"NOTIFY_SOCKET": address})
    notify.close()
    notify.close()
    notify("READY=1")
    assert _receive_all(sock) == []
    assert (notify.sent, notify.failures) == (0, 0)


def test_socket_is_not_inherited_by_children(
    make_notifier: MakeNotifier, path_receiver: tuple[socket.socket, str]
) -> None:
    notify = make_notifier({"NOTIFY_SOCKET": path_receiver[1]})
    assert notify._sock is not None
    assert not notify._sock.get_inheritable()
    notify.close()


# -- watchdog ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"WATCHDOG_USEC": "200000"}, 0.1),
        ({"WATCHDOG_USEC": "200000", "WATCHDOG_PID": str(os.getpid())}, 0.1),
        ({"WATCHDOG_USEC": "200000", "WATCHDOG_PID": ""}, 0.1),
        ({"WATCHDOG_USEC": "30000000"}, 15.0),
        ({"WATCHDOG_USEC": "200000", "WATCHDOG_PID": str(os.getpid() + 1)}, None),
        ({"WATCHDOG_USEC": "200000", "WATCHDOG_PID": "1"}, None),
        ({}, None),
        ({"WATCHDOG_PID": str(os.getpid())}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({"WATCHDOG_USEC": "200000", "WATCHDOG_PID": "me"}, None),
    ],
)
def test_watchdog_interval(environ: dict[str, str], expected: float | None) -> None:
    assert watchdog_interval(environ) == expected


async def test_watchdog_pings_every_interval(
    autojump_clock: trio.testing.MockClock,
    make_notifier: MakeNotifier,
    path_receiver: tuple[socket.socket, str],
) -> None:
    sock, address = path_receiver
    notify = make_notifier({"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "200000"})
    interval = watchdog_interval({"WATCHDOG_USEC": "200000"})
    assert interval == 0.1
    times: list[float] = []

    def record(message: str) -> None:
        times.append(trio.current_time())
        notify(message)

    with trio.fail_after(5):
        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watchdog, record, interval)
            await trio.sleep(0.35)
            nursery.cancel_scope.cancel()
    notify.close()
    assert [round(t - start, 6) for t in times] == [0.0, 0.1, 0.2, 0.3]
    assert _receive_all(sock) == [b"WATCHDOG=1"] * 4


async def test_no_watchdog_usec_means_no_pings(
    autojump_clock: trio.testing.MockClock,
    make_notifier: MakeNotifier,
    path_receiver: tuple[socket.socket, str],
) -> None:
    sock, address = path_receiver
    environ = {"NOTIFY_SOCKET": address}
    notify = make_notifier(environ)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watchdog, notify, watchdog_interval(environ))
            await trio.sleep(3)  # thirty would-be intervals of 0.1 s
            nursery.cancel_scope.cancel()
    notify.close()
    assert _receive_all(sock) == []
    assert notify.sent == 0


async def test_watchdog_for_another_pid_sends_nothing(
    autojump_clock: trio.testing.MockClock,
    make_notifier: MakeNotifier,
    path_receiver: tuple[socket.socket, str],
) -> None:
    sock, address = path_receiver
    environ = {"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "200000", "WATCHDOG_PID": "1"}
    notify = make_notifier(environ)
    with trio.fail_after(5):
        await watchdog(notify, watchdog_interval(environ))  # returns at once
    notify.close()
    assert _receive_all(sock) == []


# -- shipped files ----------------------------------------------------------------------

SYSTEMD_DIR = Path(__file__).resolve().parents[2] / "systemd"


def test_env_example_names_only_real_settings_with_valid_values() -> None:
    """Commented examples included: uncommenting any of them must not stop startup."""
    text = (SYSTEMD_DIR / "coordinator.env.example").read_text()
    pairs = re.findall(r"^#?(COORDINATOR_[A-Z_]+)=(.*)$", text, flags=re.MULTILINE)
    assert {name for name, _ in pairs} <= {s.env for s in config.SETTINGS}
    for name, value in pairs:
        config.load(file=Path(os.devnull), environ={name: value})


def test_toml_example_shows_every_setting_with_a_valid_value(tmp_path: Path) -> None:
    """The one configuration file: every setting appears, and each line, commented or
    not, loads on its own."""
    text = (SYSTEMD_DIR / "coordinator.toml.example").read_text()
    lines = re.findall(r"^#?([a-z_]+ = .*)$", text, flags=re.MULTILINE)
    # All but the secrets: a secret itself does not belong in a world-readable file.
    secrets = {"admin_token", "worker_token", "alert_smtp_password", "alert_webhook_secret"}
    expected = {s.name for s in config.SETTINGS} - secrets
    assert {line.split(" = ", 1)[0] for line in lines} == expected
    file = tmp_path / "one.toml"
    for line in lines:
        file.write_text(line + "\n")
        config.load(file=file, environ={})
    as_shipped = tmp_path / "shipped.toml"
    as_shipped.write_text(text)
    assert config.load(file=as_shipped, environ={}).worker_socket == Path(
        "/run/coordinator/worker.sock"
    )


def test_unit_loads_the_secrets_as_credentials() -> None:
    unit = (SYSTEMD_DIR / "coordinator.service").read_text()
    for credential in (config.CREDENTIAL_ADMIN_TOKEN, config.CREDENTIAL_DSN_PASSWORD):
        assert re.search(
            rf"^LoadCredential={credential}:coordinator\.{credential}$", unit, re.MULTILINE
        )
    assert re.search(r"^ExecStart=/usr/local/bin/coordinator run --migrate$", unit, re.M)


def test_unit_stop_timeout_covers_the_daemon_stop_sequence() -> None:
    unit = (SYSTEMD_DIR / "coordinator.service").read_text()
    stop = re.search(r"^TimeoutStopSec=(\d+)$", unit, flags=re.MULTILINE)
    assert stop is not None
    assert int(stop[1]) >= config.Config().stop_timeout + 20
    assert re.search(r"^Type=notify$", unit, flags=re.MULTILINE)
    assert re.search(r"^NotifyAccess=main$", unit, flags=re.MULTILINE)
