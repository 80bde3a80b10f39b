"""The view's second wall: known secret values never leave it, in any form JSON may write them."""

from __future__ import annotations

import json

import pytest

from quinebox.view.redact import MARK, Redactor, secret_names


@pytest.mark.parametrize(
    ("grants", "names"),
    [
        (["secret:API_TOKEN@api.example.com"], {"API_TOKEN"}),
        (["secret:A@x,y", "secret:B@z", "net:example.com", "ro:/tmp"], {"A", "B"}),
        (["secret:NOHOST"], set()),
        ([3, None, "secret:"], set()),
        ([], set()),
    ],
)
def test_secret_names(grants, names):
    assert secret_names(grants) == names


ENV = {"OPENAI_API_KEY": "sk-live-0123456789abcdef", "MY_SERVICE": 'pa"ss\\word-42', "HOME": "/root", "SHORT_TOKEN": "abc", "LANG": "C.UTF-8"}


@pytest.mark.parametrize(
    ("value", "leaked"),
    [
        ({"message": "key sk-live-0123456789abcdef in an error"}, "sk-live-0123456789abcdef"),
        ({"deep": [{"x": "Bearer sk-live-0123456789abcdef"}]}, "sk-live-0123456789abcdef"),
        ({"m": 'the password is pa"ss\\word-42!'}, 'pa"ss\\word-42'),  # learned by name, escaped by JSON
    ],
)
def test_known_values_never_leave_in_json(value, leaked):
    redactor = Redactor(ENV, extra_names=["MY_SERVICE"])
    text = redactor.json(value)
    assert leaked not in text and json.dumps(leaked)[1:-1] not in text
    assert MARK in text
    json.loads(text)  # still JSON


def test_names_alone_hold_credentials_and_short_values_are_not_scrubbed_everywhere():
    redactor = Redactor(ENV)
    assert redactor.text("sk-live-0123456789abcdef") == MARK  # OPENAI_API_KEY, by name
    assert redactor.text("abc and /root and C.UTF-8") == "abc and /root and C.UTF-8"  # too short, or not a credential
    assert redactor.text('pa"ss\\word-42') == 'pa"ss\\word-42'  # not learned: MY_SERVICE names no credential
    redactor.learn(["MY_SERVICE"])
    assert redactor.text('x pa"ss\\word-42 y') == f"x {MARK} y"


def test_the_audit_key_file_is_scrubbed(tmp_path):
    key = tmp_path / "audit.key"
    key.write_text("audit-key-material-9876\n")
    assert Redactor({"QUINEBOX_AUDIT_KEY_FILE": str(key)}).text("a audit-key-material-9876 b") == f"a {MARK} b"
