"""coordinator.text (allowed names, printable text) and the log's escaping (pure, no DB)."""

from __future__ import annotations

import io
import json
import random
import sys

import pytest

from coordinator.errors import InvalidInput, JobNotFound
from coordinator.log import EventLog
from coordinator.text import BIDI, CONTROL, check_job_name, check_namespace, printable, unbidi

#: Every control character the rules name, one by one (PostgreSQL text has no U+0000).
CONTROLS = [chr(c) for c in (*range(0x20), 0x7F, *range(0x80, 0xA0), 0x2028, 0x2029)]


def test_control_is_exactly_the_documented_set() -> None:
    found = [chr(c) for c in range(sys.maxunicode + 1) if CONTROL.fullmatch(chr(c))]
    assert found == CONTROLS


@pytest.mark.parametrize(
    "name",
    [
        "backup",
        "<script>alert(1)</script>",
        "reports/daily",
        "a/b/c%2F",
        "x",
        "x" * 200,
        "café au lait ☕",
        "inner  spaces\u00a0ok",
        "quote'and\"double",
    ],
)
def test_allowed_job_names(name: str) -> None:
    assert check_job_name(name) == name


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("", "must be a non-empty string"),
        (None, "must be a non-empty string"),
        (3, "must be a non-empty string"),
        ("x" * 201, "at most 200 characters, not 201"),
        ("a\nb", "'a\\nb': control characters are not allowed (U+000A at character 2)"),
        ("a\rb", "(U+000D at character 2)"),
        ("\x1b[31mred", "(U+001B at character 1)"),
        ("tab\there", "(U+0009 at character 4)"),
        ("del\x7f", "(U+007F at character 4)"),
        ("c1\x85", "(U+0085 at character 3)"),
        ("ls\u2028", "(U+2028 at character 3)"),
        ("ps\u2029", "(U+2029 at character 3)"),
        (" lead", "must not start or end with whitespace"),
        ("trail ", "must not start or end with whitespace"),
        ("\u3000ideographic", "must not start or end with whitespace"),
        ("nbsp\u00a0", "must not start or end with whitespace"),
    ],
)
def test_refused_job_names(name: object, reason: str) -> None:
    with pytest.raises(InvalidInput) as info:
        check_job_name(name, "jobs[0].name")
    assert info.value.field == "jobs[0].name"
    assert reason in info.value.reason
    assert CONTROL.search(str(info.value)) is None  # the message is one printable line


def test_every_control_character_is_refused_in_a_name() -> None:
    for char in CONTROLS:
        with pytest.raises(InvalidInput, match=f"U\\+{ord(char):04X} at character 2"):
            check_job_name(f"a{char}b")


def test_a_long_random_name_is_refused_in_one_short_line() -> None:
    rng = random.Random(11)
    name = "".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(3000))
    with pytest.raises(InvalidInput) as info:
        check_job_name(name)
    assert str(info.value) == "name: at most 200 characters, not 3000"


@pytest.mark.parametrize("namespace", ["default", "a", "billing-eu.v2_x", "0day", "A" * 63])
def test_allowed_namespaces(namespace: str) -> None:
    assert check_namespace(namespace) == namespace


@pytest.mark.parametrize(
    ("namespace", "reason"),
    [
        ("", "must be a non-empty string"),
        (None, "must be a non-empty string"),
        ("A" * 64, "at most 63 characters, not 64"),
        ("-lead", "starting with a letter or a digit"),
        (".hidden", "starting with a letter or a digit"),
        ("has space", "use letters, digits"),
        ("team/a", "use letters, digits"),
        ("caf\u00e9", "use letters, digits"),
        ("a\nb", "'a\\nb': use letters"),
    ],
)
def test_refused_namespaces(namespace: object, reason: str) -> None:
    with pytest.raises(InvalidInput) as info:
        check_namespace(namespace, "--namespace")
    assert info.value.field == "--namespace"
    assert reason in info.value.reason
    assert CONTROL.search(str(info.value)) is None


def test_printable_escapes_each_control_character_and_nothing_else() -> None:
    assert printable("a\nb\r\tc") == "a\\nb\\r\\tc"
    assert printable("\x1b[2J\x07") == "\\x1b[2J\\x07"
    assert printable("\x7f\x85\x9f") == "\\x7f\\x85\\x9f"
    assert printable("\u2028\u2029") == "\\u2028\\u2029"
    plain = "café <b>/x</b> \\ ☕ \u00a0"
    assert printable(plain) == plain
    for char in CONTROLS:
        assert CONTROL.search(printable(f"x{char}y")) is None


def test_bidirectional_formatting_is_allowed_in_names_and_shown_escaped() -> None:
    """A name with U+202E (right-to-left override) was shown reordered: "abc" + RLO +
    "evil" read "abclive" on the page, in ``jobs list`` and in ``top``."""
    spoof = "مرحبا\u202eevil"
    assert check_job_name(spoof) == spoof  # (stored as given: a name may be RTL)
    assert printable(spoof) == "مرحبا\\u202eevil"
    assert unbidi(spoof) == "مرحبا\\u202eevil"
    assert unbidi("a\nb") == "a\nb"  # (unbidi: the page's; newlines are HTML's to show)
    for code in (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)):
        assert BIDI.fullmatch(chr(code)), hex(code)
        assert printable(chr(code)) == f"\\u{code:04x}"
    assert BIDI.search("مرحبا שלום café") is None  # RTL letters themselves are not


def test_an_unknown_job_is_named_briefly() -> None:
    assert str(JobNotFound("billing", "nightly")) == "unknown job billing/nightly"
    assert str(JobNotFound("?", "#999999")) == "unknown job #999999"  # (was "?/#999999")
    long = JobNotFound("billing", "x" * 5000)  # (quoted whole in a 404)
    assert str(long) == "unknown job billing/" + "x" * 200 + "..."
    assert long.name == "x" * 5000


# --------------------------------------------------------------------------- log lines


def _logfmt(**fields: object) -> str:
    stream = io.StringIO()
    EventLog(stream=stream, journal=False).info("job.run", **fields)
    return stream.getvalue()


def test_logfmt_escapes_control_characters_in_values() -> None:
    line = _logfmt(job="default/a\nb", error="boom\r\n\x1b[31mred\x7f\x85\u2028end", ok="plain")
    assert line.endswith("\n")
    assert line.count("\n") == 1
    assert CONTROL.search(line[:-1]) is None
    assert ' job="default/a\\nb"' in line
    assert ' error="boom\\r\\n\\u001b[31mred\\u007f\\u0085\\u2028end"' in line
    assert " ok=plain" in line


@pytest.mark.parametrize("char", CONTROLS)
def test_logfmt_quotes_a_value_with_any_control_character(char: str) -> None:
    line = _logfmt(job=f"a{char}b")
    assert CONTROL.search(line[:-1]) is None
    value = line.split(" job=", 1)[1].rstrip("\n")
    assert json.loads(value) == f"a{char}b"  # the quoted value reads back exactly


def test_json_log_escapes_control_characters() -> None:
    stream = io.StringIO()
    EventLog(format="json", stream=stream, journal=False).info("x", job="a\x7fb\x1b\u2028")
    line = stream.getvalue()
    assert CONTROL.search(line[:-1]) is None
    assert json.loads(line)["job"] == "a\x7fb\x1b\u2028"


def test_width_counts_terminal_columns() -> None:
    """``jobs list`` padded cells by characters: a wide name pushed its row's later columns
    right of the others'."""
    from coordinator.text import pad, width

    assert width("abc") == 3
    assert width("日本語ジョブ") == 12
    assert width("e\u0301") == 1  # e and a combining acute accent
    assert pad("日本", 6) == "日本  "
    assert width(pad("ab", 6)) == width(pad("日本語", 6)) == 6


def test_logfmt_keeps_letters_of_any_script_as_they_are() -> None:
    """`ü` and `日` were written \\u00fc and \\u65e5 in a quoted value: unreadable in
    journalctl, and a grep for the job's name did not find it. Only control characters
    are escaped."""
    line = _logfmt(job='default/ünïcødé ✓ 日本語 "quote"', error="a\x85b")
    assert ' job="default/ünïcødé ✓ 日本語 \\"quote\\""' in line
    assert ' error="a\\u0085b"' in line
    assert json.loads(line.split(" job=", 1)[1].split(" error=")[0]) == (
        'default/ünïcødé ✓ 日本語 "quote"'
    )
