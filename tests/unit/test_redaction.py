"""Passwords of the configured URLs are masked in URLs, free text, settings errors and log records."""

from __future__ import annotations

import io
import logging

import pytest

from workers.runtime.errors import SettingsError
from workers.runtime.redaction import RedactingFilter, redact, redact_url, secrets_of
from workers.settings import Settings

SECRET = "s3cr3t-Pass"


@pytest.mark.parametrize(("url", "masked"), [
    (f"redis://:{SECRET}@cache:6379/0", "redis://:***@cache:6379/0"),
    (f"rediss://default:{SECRET}@cache:6380/1", "rediss://default:***@cache:6380/1"),
    (f"postgresql://mnemos:{SECRET}@db:5432/mnemos", "postgresql://mnemos:***@db:5432/mnemos"),
    (f"host=db user=mnemos password={SECRET} dbname=mnemos", "host=db user=mnemos password=*** dbname=mnemos"),
    ("redis://cache:6379/0", "redis://cache:6379/0"),
    ("postgresql://postgres@127.0.0.1:5432/mnemos", "postgresql://postgres@127.0.0.1:5432/mnemos"),
])
def test_urls_keep_everything_but_the_password(url: str, masked: str) -> None:
    assert redact_url(url) == masked


def test_secrets_are_found_in_malformed_and_encoded_urls() -> None:
    assert secrets_of([f"redis//:{SECRET}@cache/0"]) == (SECRET,)
    assert set(secrets_of(["postgresql://u:p%40ss:word@db/x"])) == {"p%40ss:word", "p@ss:word"}
    echoed = f'missing "=" after "postgresql//u:{SECRET}@db/x" in connection info string'
    assert SECRET not in redact(echoed, secrets_of([f"postgresql//u:{SECRET}@db/x"]))
    assert redact("Error 111 connecting to 127.0.0.1:6399. Connection refused.") == (
        "Error 111 connecting to 127.0.0.1:6399. Connection refused.")


@pytest.mark.parametrize("env", [{"MNEMOS_REDIS_URL": f"redis//:{SECRET}@cache/0"},
                                 {"MNEMOS_REDIS_URL": f"redis://:{SECRET}@cache:port/0"},
                                 {"MNEMOS_DATABASE_URL": f"mysql://root:{SECRET}@db/x"},
                                 {"MNEMOS_DATABASE_URL": f"postgresql://root:{SECRET}@db:port/x"},
                                 {"MNEMOS_DATABASE_URL": "just-a-name"}])
def test_malformed_urls_are_refused_without_their_password(env: dict[str, str]) -> None:
    with pytest.raises(SettingsError) as info:
        Settings.from_env(env)
    assert SECRET not in str(info.value) and next(iter(env)) in str(info.value)


def test_multi_host_and_socket_urls_are_accepted() -> None:
    Settings(database_url="postgresql://u@db1:5432,db2:5433/x", redis_url="unix:///run/redis.sock")
    Settings(database_url="postgresql://postgres:@/postgres?host=/tmp/pg", redis_url="redis://[::1]:6379/0")


def test_log_records_and_tracebacks_are_masked() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter([SECRET]))
    logger = logging.getLogger("test_redaction")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("connecting to %s", f"redis://:{SECRET}@cache/0")
        try:
            raise ValueError(f"bad password {SECRET}")
        except ValueError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    text = stream.getvalue()
    assert SECRET not in text
    assert "redis://:***@cache/0" in text and "bad password ***" in text and "Traceback" in text
