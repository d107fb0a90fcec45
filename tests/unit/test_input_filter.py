"""The input filter's default patterns and limits (its use at create is in test_tracer.py)."""

from __future__ import annotations

import pytest

from collector import InputFilter


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("use token: tok_live_123456", "tok_live_123456"),
        ('set PASSWORD="correct horse battery"', "correct horse"),
        ("api-key=abcd1234efgh", "abcd1234efgh"),
        ("curl -H 'Authorization: Bearer eyJhbGciOi.x'", "eyJhbGciOi"),
        (
            "jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJlX19f here",
            "eyJzdWIiOiIxMjM0In0",
        ),
        ("key sk-proj-AbCdEfGhIjKlMnOpQrStUv", "AbCdEfGhIjKlMnOpQrStUv"),
        ("gh ghp_0123456789abcdefghijABCDEFGHIJ", "ghp_0123456789"),
        ("slack xoxb-1234-5678-abcdefghij", "xoxb-1234"),
        ("aws AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE"),
        ("google AIzaSyA-1234567890abcdefghijklmnopqrstu", "AIzaSyA"),
        ("-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----", "MIIEow"),
        ("write to Jane.Doe+ops@mail.example.org now", "Jane.Doe"),
    ],
)
def test_default_patterns_redact(text, secret):
    out = InputFilter().redact_text(text)
    assert secret not in out
    assert "[REDACTED]" in out


def test_default_filter_leaves_ordinary_text_alone():
    f = InputFilter()
    text = "fix bug 12: the parser drops the last line; keys are sorted; author: Ann"
    assert f.redact_text(text) == text
    assert f.redact({"lang": "python", "max_files": 3, "paths": ["a.py", "b.py"], "ok": True}) == {
        "lang": "python",
        "max_files": 3,
        "paths": ["a.py", "b.py"],
        "ok": True,
    }


def test_filter_limits_depth_and_memo_does_not_change_results():
    f = InputFilter()
    deep: dict = {"v": "x"}
    for _ in range(40):
        deep = {"d": deep}
    out = f.redact(deep)
    for _ in range(32):
        out = out["d"]
    assert out == "[REDACTED]"  # past depth 32 the value is replaced whole
    assert f.redact_text("password=1") == f.redact_text("password=1") == "password=[REDACTED]"
