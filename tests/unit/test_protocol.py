"""The worker protocol's wire format: round trips, limits and rejections (pure)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

from coordinator.errors import CoordinatorError
from coordinator.protocol import (
    MAX_CAPACITY,
    MAX_CURSOR,
    MAX_FINDINGS,
    MAX_LABEL,
    MAX_LINE,
    MAX_MESSAGE,
    NO_CURSOR,
    VERSION,
    Bye,
    Call,
    Cancel,
    Checkpoint,
    Declare,
    DeclaredJob,
    Error,
    Finding,
    FindingItem,
    Hello,
    LineBuffer,
    Message,
    Progress,
    ProtocolError,
    Result,
    Welcome,
    encode,
    encode_success,
    parse,
    parse_from_daemon,
    parse_from_worker,
    storable,
)

T0 = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)

MESSAGES: list[Message] = [
    Hello(worker="w1", types=("billing", "mail"), capacity=4),
    Hello(worker="w1", types=["a"], capacity=MAX_CAPACITY, token="s3cret"),
    Progress(run=7, mode="determinate", percent=42.5, message="halfway"),
    Progress(run=7, mode="determinate", percent=0),
    Progress(run=7, mode="indeterminate", message="busy"),
    Progress(run=7, mode="step", label="upload"),
    Progress(run=7, mode="step", label="upload", percent=100, message="done"),
    Checkpoint(run=7, cursor={"offset": 1200, "ids": [1, 2, 3]}),
    Checkpoint(run=7, cursor=None),
    Checkpoint(run=7, cursor="page-3"),
    Checkpoint(run=7, cursor={"after": "k-9"}, count=10),
    Checkpoint(run=7, cursor=None, count=-2),
    Finding(
        run=7,
        findings=(
            FindingItem(kind="missing_blob", resource_id="ab12", severity="data_loss"),
            FindingItem(
                kind="size", resource_id="é/1", severity="warning", detail={"want": 3, "got": 2}
            ),
        ),
    ),
    Result(run=7, ok=True),
    Result(run=7, ok=True, paused=True),
    Result(run=7, ok=True, paused=True, cursor={"after": 40}, count=4),
    Result(run=7, ok=True, cursor=None),
    Result(run=7, ok=True, count=12, extra={"files": ["a", "b"], "nested": {"x": 1.5}}),
    Result(run=7, ok=False, error="boom", count=3),
    Result(run=7, ok=False, error="bad row", retryable=False, category="invalid-input"),
    Result(run=7, ok=False, retryable=True),
    Bye(),
    Welcome(worker="w1"),
    Call(
        run=7,
        job="sweep",
        namespace="billing",
        job_type="billing",
        args={"force": True},
        params={"table": "t"},
        deadline=T0 + timedelta(seconds=30),
        attempt=2,
        checkpoint={"offset": 10},
        trigger="schedule",
        scheduled_for=T0,
    ),
    Call(run=8, job="j", namespace="default", job_type="t"),
    Call(
        run=9,
        job="scan",
        namespace="ops",
        job_type="scan",
        checkpoint=[1, "a"],
        recoverable=True,
        count=120,
    ),
    Cancel(run=7, reason="timeout"),
    Cancel(run=7, reason="pause"),
    Error(message="malformed JSON"),
    Declare(
        namespace="reports",
        jobs=(
            DeclaredJob(
                name="reports.daily",
                job_type="reports.daily",
                schedule="cron",
                expression="0 6 * * *",
                timezone="Europe/Berlin",
                timeout="10m",
            ),
            DeclaredJob(
                name="reports.sweep",
                job_type="reports.sweep",
                schedule="every",
                expression="15m",
                retries=3,
                retry_backoff="1m",
                retry_max_delay="10m",
                misfire="skip",
                misfire_grace="5m",
                recoverable=True,
                alert=False,
                keep_last=20,
                retention="7d",
                params={"keep": 30},
                idempotent=True,
            ),
            DeclaredJob(name="reports.rebuild", job_type="reports.rebuild", schedule="manual"),
        ),
    ),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_round_trip(message: Message) -> None:
    line = encode(message)
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1
    body = json.loads(line)
    assert body["v"] == VERSION
    assert body["type"] == message.TYPE
    assert parse(line) == message
    assert parse(line.decode()) == message


def test_one_sided_parsers() -> None:
    assert isinstance(parse_from_worker(encode(Bye())), Bye)
    assert isinstance(parse_from_daemon(encode(Welcome(worker="w"))), Welcome)
    with pytest.raises(ProtocolError, match="sent by the daemon"):
        parse_from_worker(encode(Cancel(run=1, reason="timeout")))
    with pytest.raises(ProtocolError, match="sent by a worker"):
        parse_from_daemon(encode(Result(run=1, ok=True)))


def test_call_wire_shape() -> None:
    """What a worker in another language reads (docs/worker-protocol.md)."""
    call = Call(
        run=7,
        job="sweep",
        namespace="billing",
        job_type="billing.sweep",
        deadline=datetime(2024, 3, 1, 12, 0, 30, tzinfo=UTC),
    )
    assert json.loads(encode(call)) == {
        "v": 1,
        "type": "call",
        "run": 7,
        "job": "sweep",
        "namespace": "billing",
        "job_type": "billing.sweep",
        "args": {},
        "params": {},
        "deadline": "2024-03-01T12:00:30+00:00",
        "attempt": 1,
        "checkpoint": None,
    }


def test_a_declared_jobs_defaults_stay_off_the_wire() -> None:
    """What a job does not declare is not sent (the daemon's default applies); a policy
    that differs is, under the manifest's key."""
    plain = DeclaredJob(name="j", job_type="t", schedule="every", expression="1m")
    assert plain.to_wire() == {"name": "j", "job_type": "t", "every": "1m"}
    told = DeclaredJob(name="j", job_type="t", schedule="manual", retries=0, alert=False,
                       recoverable=True, keep_last=1)  # fmt: skip
    assert told.to_wire() == {"name": "j", "job_type": "t", "manual": True, "retries": 0,
                              "keep_last": 1, "recoverable": True, "alert": False}  # fmt: skip


def test_unknown_fields_are_ignored() -> None:
    line = b'{"v":1,"type":"bye","future":"field"}'
    assert parse(line) == Bye()
    line = b'{"v":1,"type":"result","run":3,"ok":true,"count":1,"later":[1]}'
    assert parse(line) == Result(run=3, ok=True, count=1)


def test_nulls_count_as_absent() -> None:
    line = b'{"v":1,"type":"result","run":3,"ok":false,"count":null,"extra":null,"error":null}'
    assert parse(line) == Result(run=3, ok=False)
    line = b'{"v":1,"type":"result","run":3,"ok":false,"retryable":null,"category":null}'
    assert parse(line) == Result(run=3, ok=False)


def test_result_retry_fields_on_the_wire() -> None:
    """``retryable`` and ``category`` are sent only when said; a category word this side
    does not know still parses (the daemon records it as ``unknown``)."""
    assert "retryable" not in encode(Result(run=1, ok=False)).decode()
    line = b'{"v":1,"type":"result","run":1,"ok":false,"retryable":false,"category":"later"}'
    assert parse(line) == Result(run=1, ok=False, retryable=False, category="later")


@pytest.mark.parametrize(
    ("count", "extra"),
    [(None, None), (0, None), (-(2**63), {}), (2**63 - 1, {"a": [1, "é"]}), (7, {"k": None})],
)
def test_a_success_line_says_what_its_result_would(count: int | None, extra: object) -> None:
    """``encode_success`` writes its line directly, not through a ``Result``: the daemon
    reads the same message from it."""
    assert isinstance(extra, dict | None)
    line = encode_success(9, count, extra)
    assert line.endswith(b"}\n")
    assert b"\n" not in line[:-1]
    assert parse(line) == parse(encode(Result(run=9, ok=True, count=count, extra=extra or None)))


def test_a_success_line_is_lenient_in_extra_and_strict_in_its_numbers() -> None:
    at = datetime(2026, 12, 1, 19, 0, tzinfo=UTC)
    result = parse(encode_success(3, 1, {"at": at, "n": 1.5}))
    assert isinstance(result, Result)
    assert result.extra == {"at": str(at), "n": 1.5}
    for run, count in [(0, None), (True, None), (2**63, None), (1, True), (1, 2**63), (1, 1.5)]:
        with pytest.raises(ProtocolError) as caught:
            encode_success(run, count, None)  # type: ignore[arg-type]
        with pytest.raises(ProtocolError) as expected:
            Result(run=run, ok=True, count=count)  # type: ignore[arg-type]
        assert str(caught.value) == str(expected.value)
    # NaN and infinities too, as the protocol's document says of what JSON cannot say.
    nan = parse(encode_success(1, None, {"x": float("nan"), "y": [float("inf")]}))
    assert isinstance(nan, Result)
    assert nan.extra == {"x": "nan", "y": ["inf"]}


REJECTED = [
    (b"{not json", "malformed JSON"),
    (b"[1, 2]", "must be a JSON object"),
    (b'"hello"', "must be a JSON object"),
    (b"\xff\xfe{}", "not UTF-8"),
    (b'{"type":"bye"}', "missing 'v'"),
    (b'{"v":2,"type":"bye"}', "unsupported protocol version 2"),
    (b'{"v":true,"type":"bye"}', "unsupported protocol version true"),  # (JSON's words)
    (b"[1, 2]", "a message must be a JSON object, not an array"),
    (b"null", "a message must be a JSON object, not null"),
    (b'{"v":1}', "missing 'type'"),
    (b'{"v":1,"type":5}', "missing 'type'"),
    (b'{"v":1,"type":"launch"}', "unknown message type 'launch'"),
    (b'{"v":1,"type":"hello","types":["a"],"capacity":1}', "missing 'worker'"),
    (b'{"v":1,"type":"hello","worker":"","types":["a"],"capacity":1}', "non-empty string"),
    (b'{"v":1,"type":"hello","worker":"w","types":[],"capacity":1}', "at least one job type"),
    (b'{"v":1,"type":"hello","worker":"w","types":"a","capacity":1}', "must be a JSON array"),
    (b'{"v":1,"type":"hello","worker":"w","types":[1],"capacity":1}', "every job type"),
    (b'{"v":1,"type":"hello","worker":"w","types":["a","a"],"capacity":1}', "twice"),
    (b'{"v":1,"type":"hello","worker":"w","types":["a"],"capacity":0}', "from 1 to 1024"),
    (b'{"v":1,"type":"hello","worker":"w","types":["a"],"capacity":1025}', "from 1 to 1024"),
    (b'{"v":1,"type":"hello","worker":"w","types":["a"],"capacity":2.5}', "an integer"),
    (b'{"v":1,"type":"hello","worker":"w","types":["a"],"capacity":true}', "an integer"),
    (b'{"v":1,"type":"progress","run":1,"mode":"fast"}', "'mode' must be one of"),
    (b'{"v":1,"type":"progress","run":1,"mode":"determinate"}', "needs a 'percent'"),
    (b'{"v":1,"type":"progress","run":1,"mode":"determinate","percent":101}', "0 to 100"),
    (b'{"v":1,"type":"progress","run":1,"mode":"determinate","percent":-1}', "0 to 100"),
    (b'{"v":1,"type":"progress","run":1,"mode":"determinate","percent":NaN}', "malformed"),
    (b'{"v":1,"type":"progress","run":1,"mode":"indeterminate","percent":5}', "takes no"),
    (b'{"v":1,"type":"progress","run":1,"mode":"step"}', "needs a non-empty 'label'"),
    (b'{"v":1,"type":"progress","run":0,"mode":"indeterminate"}', "positive"),
    (b'{"v":1,"type":"progress","run":"7","mode":"indeterminate"}', "'run' must be an integer"),
    (b'{"v":1,"type":"checkpoint","run":1}', "missing 'cursor'"),
    (b'{"v":1,"type":"result","run":1}', "missing 'ok'"),
    (b'{"v":1,"type":"result","run":1,"ok":"yes"}', "true or false"),
    (b'{"v":1,"type":"result","run":1,"ok":true,"count":1.5}', "'count' must be an integer"),
    (b'{"v":1,"type":"result","run":1,"ok":true,"count":9223372036854775808}', "64-bit"),
    (b'{"v":1,"type":"result","run":1,"ok":true,"extra":[1]}', "a JSON object"),
    (b'{"v":1,"type":"result","run":1,"ok":false,"retryable":"no"}', "'retryable' must be true"),
    (b'{"v":1,"type":"result","run":1,"ok":false,"retryable":0}', "'retryable' must be true"),
    (b'{"v":1,"type":"result","run":1,"ok":false,"category":5}', "'category' must be a string"),
    (
        b'{"v":1,"type":"result","run":1,"ok":false,"category":"' + b"x" * 65 + b'"}',
        "'category' is longer than 64",
    ),
    (b'{"v":1,"type":"result","run":1,"ok":false,"paused":true}', "'paused' needs 'ok': true"),
    (b'{"v":1,"type":"result","run":1,"ok":true,"paused":1}', "true or false"),
    (b'{"v":1,"type":"checkpoint","run":1,"cursor":1,"count":"2"}', "'count' must be an"),
    (b'{"v":1,"type":"checkpoint","run":1,"cursor":1,"count":true}', "'count' must be an"),
    (b'{"v":1,"type":"finding","run":1}', "missing 'findings'"),
    (b'{"v":1,"type":"finding","run":1,"findings":[]}', "at least one finding"),
    (b'{"v":1,"type":"finding","run":1,"findings":{}}', "must be a JSON array"),
    (b'{"v":1,"type":"finding","run":1,"findings":[1]}', r"findings\[0\] must be a JSON object"),
    (
        b'{"v":1,"type":"finding","run":1,"findings":[{"kind":"k","severity":"info"}]}',
        r"findings\[0\]: missing 'resource_id'",
    ),
    (
        b'{"v":1,"type":"finding","run":1,"findings":'
        b'[{"kind":"k","resource_id":"r","severity":"fatal"}]}',
        "'severity' must be one of info, warning, error, data_loss, not 'fatal'",
    ),
    (
        b'{"v":1,"type":"finding","run":1,"findings":'
        b'[{"kind":"","resource_id":"r","severity":"info"}]}',
        "'kind' must be a non-empty string",
    ),
    (
        b'{"v":1,"type":"finding","run":1,"findings":'
        b'[{"kind":"k","resource_id":5,"severity":"info"}]}',
        "'resource_id' must be a string",
    ),
    (
        b'{"v":1,"type":"finding","run":1,"findings":'
        b'[{"kind":"k","resource_id":"r","severity":"info","detail":[1]}]}',
        "'detail' must be a JSON object",
    ),
    (
        b'{"v":1,"type":"call","run":1,"job":"j","namespace":"n","job_type":"t",'
        b'"recoverable":"yes"}',
        "true or false",
    ),
    (
        b'{"v":1,"type":"declare","namespace":"n","jobs":[{"name":"j","job_type":"t",'
        b'"manual":true,"retries":"3"}]}',
        r"declare: jobs\[0\]: 'retries' must be an integer, not '3'",
    ),
    (
        b'{"v":1,"type":"declare","namespace":"n","jobs":[{"name":"j","job_type":"t",'
        b'"manual":true,"alert":"no"}]}',
        "'alert' must be true or false",
    ),
    (
        b'{"v":1,"type":"declare","namespace":"n","jobs":[{"name":"j","job_type":"t",'
        b'"manual":true,"retention":7}]}',
        "'retention' must be a string",
    ),
    (
        b'{"v":1,"type":"declare","namespace":"n","jobs":[{"name":"j","job_type":"t",'
        b'"manual":true,"retry":3}]}',
        "unknown key 'retry'",
    ),
    (b'{"v":1,"type":"call","run":1,"job":"j","namespace":"n"}', "missing 'job_type'"),
    (
        b'{"v":1,"type":"call","run":1,"job":"j","namespace":"n","job_type":"t","deadline":"soon"}',
        "ISO 8601",
    ),
    (
        b'{"v":1,"type":"call","run":1,"job":"j","namespace":"n","job_type":"t",'
        b'"deadline":"2024-03-01T12:00:00"}',
        "UTC offset",
    ),
]


@pytest.mark.parametrize(("line", "expected"), REJECTED)
def test_rejections(line: bytes, expected: str) -> None:
    with pytest.raises(ProtocolError, match=expected) as info:
        parse(line)
    assert isinstance(info.value, CoordinatorError)
    assert isinstance(info.value, ValueError)
    assert info.value.message == str(info.value)


def test_too_deep_is_rejected() -> None:
    line = b'{"v":1,"type":"bye","x":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(ProtocolError):
        parse(line[:MAX_LINE])


def test_oversized_line_is_rejected() -> None:
    padding = "x" * MAX_LINE
    with pytest.raises(ProtocolError, match="longer than"):
        parse(json.dumps({"v": 1, "type": "bye", "pad": padding}).encode())
    with pytest.raises(ProtocolError, match="longer than"):
        parse(json.dumps({"v": 1, "type": "bye", "pad": padding}))


def test_recoverable_wire_shapes() -> None:
    """What a worker in another language reads and writes for a recoverable job."""
    call = Call(
        run=7, job="scan", namespace="ops", job_type="scan", checkpoint={"after": 9},
        recoverable=True, count=9,
    )  # fmt: skip
    body = json.loads(encode(call))
    assert (body["checkpoint"], body["recoverable"], body["count"]) == ({"after": 9}, True, 9)
    assert "recoverable" not in json.loads(
        encode(Call(run=1, job="j", namespace="n", job_type="t"))
    )
    assert json.loads(encode(Result(run=7, ok=True, paused=True))) == {
        "v": 1, "type": "result", "run": 7, "ok": True, "paused": True
    }  # fmt: skip
    # A result without a cursor and one whose cursor is JSON null stay apart.
    assert parse(b'{"v":1,"type":"result","run":7,"ok":true}') == Result(run=7, ok=True)
    absent = parse(b'{"v":1,"type":"result","run":7,"ok":true}')
    null = parse(b'{"v":1,"type":"result","run":7,"ok":true,"cursor":null}')
    assert isinstance(absent, Result)
    assert isinstance(null, Result)
    assert absent.cursor is NO_CURSOR
    assert null.cursor is None
    finding = parse(
        b'{"v":1,"type":"finding","run":3,"findings":[{"kind":"k","resource_id":"r",'
        b'"severity":"error","detail":null}]}'
    )
    assert finding == Finding(
        run=3, findings=(FindingItem(kind="k", resource_id="r", severity="error"),)
    )
    assert isinstance(parse_from_worker(encode(finding)), Finding)
    with pytest.raises(ProtocolError, match="sent by a worker"):
        parse_from_daemon(encode(finding))


def test_finding_limits() -> None:
    item = FindingItem(kind="k", resource_id="r", severity="info")
    Finding(run=1, findings=(item,) * MAX_FINDINGS)
    with pytest.raises(ProtocolError, match=f"more than {MAX_FINDINGS}"):
        Finding(run=1, findings=(item,) * (MAX_FINDINGS + 1))
    line = json.dumps(
        {"v": 1, "type": "finding", "run": 1, "findings": [item.to_wire()] * (MAX_FINDINGS + 1)}
    )
    with pytest.raises(ProtocolError, match=f"more than {MAX_FINDINGS}"):
        parse(line)
    with pytest.raises(ProtocolError, match="longer than 1000"):
        FindingItem(kind="k", resource_id="r" * 1001, severity="info")
    with pytest.raises(ProtocolError, match="16384"):
        FindingItem(kind="k", resource_id="r", severity="info", detail={"d": "x" * MAX_CURSOR})
    with pytest.raises(ProtocolError, match="16384"):
        Result(run=1, ok=True, paused=True, cursor="c" * MAX_CURSOR)


def test_limits_on_construction() -> None:
    with pytest.raises(ProtocolError, match="longer than 500"):
        Progress(run=1, mode="indeterminate", message="m" * (MAX_MESSAGE + 1))
    Progress(run=1, mode="indeterminate", message="m" * MAX_MESSAGE)
    with pytest.raises(ProtocolError, match="16384"):
        Checkpoint(run=1, cursor="c" * MAX_CURSOR)
    with pytest.raises(ProtocolError, match="not JSON"):
        Checkpoint(run=1, cursor=object())
    with pytest.raises(ProtocolError, match="not JSON"):
        Checkpoint(run=1, cursor=float("nan"))
    with pytest.raises(ProtocolError, match="aware"):
        Call(run=1, job="j", namespace="n", job_type="t", deadline=datetime(2024, 1, 1))
    with pytest.raises(ProtocolError, match="list of job types"):
        Hello(worker="w", types="abc", capacity=1)  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match="percent"):
        Progress(run=1, mode="determinate", percent=True)


def test_escaped_nul_and_lone_surrogate_become_storable() -> None:
    line = (
        b'{"v":1,"type":"result","run":1,"ok":false,"error":"a\\u0000b",'
        b'"extra":{"k\\ud800":"\\udc00x","ok":"\\ud83d\\ude00"}}'
    )
    message = parse(line)
    assert isinstance(message, Result)
    assert message.error == "a\ufffdb"
    assert message.extra == {"k\ufffd": "\ufffdx", "ok": "\U0001f600"}
    assert storable(["\x00", {"a": 1}]) == ["\ufffd", {"a": 1}]


def test_datetimes_keep_their_offset() -> None:
    cet = timezone(timedelta(hours=1))
    call = Call(run=1, job="j", namespace="n", job_type="t", deadline=T0.astimezone(cet))
    parsed = parse(encode(call))
    assert isinstance(parsed, Call)
    assert parsed.deadline == T0


def test_line_buffer_splits_and_skips_blank_lines() -> None:
    buf = LineBuffer()
    assert buf.feed(b'{"a":1}\n{"b"') == [b'{"a":1}']
    assert buf.pending == 4
    assert buf.feed(b':2}\n\n  \r\n{"c":3}\r\n') == [b'{"b":2}', b'{"c":3}\r']
    assert buf.pending == 0


def test_line_buffer_refuses_oversized_lines() -> None:
    buf = LineBuffer(limit=10)
    assert buf.feed(b"0123456789\n") == [b"0123456789"]
    with pytest.raises(ProtocolError, match="longer than 10"):
        buf.feed(b"0123456789A\n")
    buf = LineBuffer(limit=10)
    buf.feed(b"01234")
    with pytest.raises(ProtocolError, match="longer than 10"):
        buf.feed(b"56789AB")  # no newline yet: refused before it grows further
    with pytest.raises(ProtocolError):
        LineBuffer(limit=10).feed(b"ok\n" + b"x" * 11)


def test_line_buffer_full_size_line() -> None:
    line = encode(Result(run=1, ok=True, extra={"pad": "x" * (MAX_LINE - 100)}))
    assert len(line) - 1 <= MAX_LINE
    buf = LineBuffer()
    chunks = [line[i : i + 4096] for i in range(0, len(line), 4096)]
    out: list[bytes] = []
    for chunk in chunks:
        out += buf.feed(chunk)
    assert out == [line[:-1]]


def test_a_raw_workers_long_progress_text_is_cut_not_refused() -> None:
    """Progress is advisory: a label or message over its limit is cut, as the SDK cuts
    it; it was a protocol error that dropped the connection and every call on it."""
    line = json.dumps(
        {"v": 1, "type": "progress", "run": 7, "mode": "step", "label": "l" * 300,
         "message": "m" * 600}
    )  # fmt: skip
    progress = parse(line)
    assert isinstance(progress, Progress)
    assert progress.label == "l" * MAX_LABEL
    assert progress.message == "m" * MAX_MESSAGE
