"""Credentials never printed: redact passwords of Redis URLs and Postgres DSNs wherever text is shown.

Three layers, so that a secret in ``MNEMOS_REDIS_URL`` (``redis://:secret@host/0``) or in the
database URL reaches no log line, error or probe output:

* :func:`redact_url` for a URL the code prints on purpose (health, ``mnemos up``);
* :func:`redact` for any text: the password part of every ``scheme://user:password@`` and every
  ``password=...`` is masked, plus each literal secret handed in (a library may echo a malformed
  URL, or a password decoded from one);
* :class:`RedactingFilter`, which the CLI installs on the log handlers, applies :func:`redact`
  with the configured secrets to every log record, tracebacks included.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from urllib.parse import unquote

MASK = "***"
MIN_LITERAL_SECRET = 4  # shorter secrets are masked in URL and key=value form only, not everywhere

# the password runs to the LAST '@' of the authority: redis-py (like urllib) accepts an unencoded '@' in it
_URL_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*:/*[^\s/@:]*:)(?P<secret>\S*?)(?=@[^\s@/?#]*(?:[/?#\s]|$))")
_KV_PASSWORD = re.compile(r"(?P<head>\bpassword\s*=\s*)(?P<secret>'(?:[^'\\]|\\.)*'|[^\s'\"]+)", re.IGNORECASE)


def url_password(url: str) -> str | None:
    """The password of a URL's user info (also of a malformed URL such as ``redis//:pw@h``), or None.

    For a key=value DSN, the value of ``password=``.
    """
    match = _KV_PASSWORD.search(url)
    if match:
        return match.group("secret").strip("'")
    rest = url.split("://", 1)[1] if "://" in url else url
    if "@" not in rest:
        return None
    userinfo = rest.rsplit("@", 1)[0]
    if ":" not in userinfo:
        return None
    return userinfo.split(":", 1)[1] or None


def secrets_of(urls: Iterable[str]) -> tuple[str, ...]:
    """The passwords (as written and percent-decoded) found in ``urls``."""
    found: list[str] = []
    for url in urls:
        password = url_password(url or "")
        if password:
            found.extend({password, unquote(password)})
    return tuple(found)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with URL and ``password=`` secrets masked, and every literal secret of at least
    :data:`MIN_LITERAL_SECRET` characters replaced by ``***``."""
    # literal secrets first: a pattern could otherwise cut a secret in two and leave its tail readable
    for secret in sorted(set(secrets), key=len, reverse=True):
        if len(secret) >= MIN_LITERAL_SECRET:
            text = text.replace(secret, MASK)
    text = _URL_USERINFO.sub(lambda m: m.group("head") + MASK, text)
    return _KV_PASSWORD.sub(lambda m: m.group("head") + MASK, text)


def redact_url(url: str) -> str:
    """``url`` with its password masked (``redis://:***@host:6379/0``); no password: unchanged."""
    return redact(url, secrets_of([url]))


class RedactingFilter(logging.Filter):
    """A handler filter that masks secrets in each record's message and traceback (never drops one)."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.secrets = tuple(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = redact(message, self.secrets)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text, self.secrets)
        if record.stack_info:
            record.stack_info = redact(record.stack_info, self.secrets)
        return True


def install_redaction(secrets: Iterable[str], logger: logging.Logger | None = None) -> RedactingFilter:
    """Add one :class:`RedactingFilter` to every handler of ``logger`` (default: the root logger)."""
    target = logger or logging.getLogger()
    redacting = RedactingFilter(secrets)
    for handler in target.handlers:
        for old in [f for f in handler.filters if isinstance(f, RedactingFilter)]:
            handler.removeFilter(old)
        handler.addFilter(redacting)
    return redacting
