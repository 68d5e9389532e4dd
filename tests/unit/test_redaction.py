"""Secrets are redacted before any message is built, whatever the URL looks like (`http:/alice:pw@host` and
`alice:pw@host` too, not only `://`), and once more where messages leave: the log filter and `redact`."""

from __future__ import annotations

import base64
import io
import logging
from pathlib import Path

import pytest
import yaml

from regen.config import ConfigError, load_config
from regen.endpoints import Endpoint, redact_url
from regen.redaction import RedactSecrets, describe, install_log_redaction, redact, remember, remember_login
from regen.run_params import RunSpec
from tests.conftest import project_config_in

SECRET = "pw-9d2e1f"
MALFORMED = [
    pytest.param(f"http:/alice:{SECRET}@gpu-1:30000", id="one-slash"),
    pytest.param(f"alice:{SECRET}@gpu-1:30000", id="no-scheme"),
    pytest.param(f"http:alice:{SECRET}@gpu-1:30000", id="no-slash"),
    pytest.param(f"ftp://alice:{SECRET}@gpu-1:30000", id="other-scheme"),
]


@pytest.mark.parametrize("url", MALFORMED)
def test_a_refused_endpoint_is_named_without_its_login_whatever_its_scheme(url: str, tmp_roots_allowed: Path) -> None:
    with pytest.raises(ValueError) as refused:
        Endpoint.parse(url)
    assert SECRET not in str(refused.value) and "***@gpu-1:30000" in str(refused.value)
    with pytest.raises(ConfigError) as at_plan:  # a run's endpoints: plan's log and mail
        RunSpec.from_params({"endpoints": [url]}, "manual__1")
    assert SECRET not in str(at_plan.value) and "***@gpu-1:30000" in str(at_plan.value)


@pytest.mark.parametrize("url", MALFORMED)
def test_a_config_with_such_an_endpoint_fails_without_its_login(url: str, tmp_path: Path) -> None:
    """The DAG file loads the config at parse: its error is the import-error banner every viewer sees."""
    path = project_config_in(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["defaults"]["endpoints"] = [url]
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert SECRET not in str(refused.value) and "***@gpu-1:30000" in str(refused.value)
    assert refused.value.__cause__ is None and refused.value.__context__ is not None  # pydantic's: shown nowhere


@pytest.mark.parametrize(
    "url,shown",
    [
        ("http://alice:pw@host:1", "http://***@host:1"),
        ("http:/alice:pw@host:1", "http:/***@host:1"),
        ("alice:pw@host:1", "***@host:1"),
        ("http://alice:p/w@host:1", "http://***@host:1"),
        ("http://alice:p w@host 1:1", "http://***@host 1:1"),
        ("http://host:1/path", "http://host:1/path"),
        ("http://***@host:1", "http://***@host:1"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_redact_scrubs_userinfo_headers_and_known_secrets_anywhere() -> None:
    remember_login(f"bob:{SECRET}")
    remember("sk-known-key-123", "ab", None)  # too short to scrub anywhere: only in the forms below
    basic = base64.b64encode(f"bob:{SECRET}".encode()).decode()
    text = (
        f"GET http://bob:{SECRET}@h:1 and http:/bob:{SECRET}@h and bob:x@h; "
        f"headers=<CIMultiDictProxy('Authorization': 'Basic {basic}')> Bearer sk-other-key; "
        f"the key sk-known-key-123, the pair {basic}, the password {SECRET}, a tab"
    )
    assert redact(text) == (
        "GET http://***@h:1 and http:/***@h and ***@h; headers=<CIMultiDictProxy('Authorization': '***')> "
        "Bearer ***; the key ***, the pair ***, the password ***, a tab"
    )
    assert redact("a plain message: 3 of 4 ok, mail oncall@example.org") == (
        "a plain message: 3 of 4 ok, mail oncall@example.org"
    )


def test_describe_is_type_and_redacted_text_never_repr() -> None:
    class Leaky(Exception):
        def __repr__(self) -> str:
            return f"Leaky(headers={{'Authorization': 'Basic {SECRET}'}})"

    assert describe(Leaky(f"from http://u:{SECRET}@h:1")) == "Leaky: from http://***@h:1"
    assert describe(TimeoutError()) == "TimeoutError"


def test_the_log_filter_scrubs_message_arguments_and_traceback() -> None:
    remember_login(f"carol:{SECRET}")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("regen.test_redaction")
    logging.getLogger().addHandler(handler)  # where a task's log handler is: every record propagates to it
    try:
        install_log_redaction()
        install_log_redaction()  # once per handler
        assert sum(isinstance(f, RedactSecrets) for f in handler.filters) == 1
        try:
            raise RuntimeError(f"Authorization: Bearer {SECRET}")
        except RuntimeError:
            logger.exception("asked %s (%r)", f"http://carol:{SECRET}@h:1", {"password": SECRET})
        logger.warning("%s", "100% done")  # a percent in a formatted message: the record is formatted once
        logger.warning("bad %d", "arguments")  # refused by %-formatting: shown, not raised
    finally:
        logging.getLogger().removeHandler(handler)
    output = stream.getvalue()
    assert SECRET not in output and "asked http://***@h:1" in output and "RuntimeError" in output
    assert "100% done" in output and "bad %d (unformattable arguments)" in output
