"""Bearer tokens of the HTTP transport: each token names one tenant (docs/architecture.md "Agents").

Tokens come from a JSON object ``{"<token>": "<tenant id>", ...}`` in the file
``MNEMOS_MCP_TOKENS_FILE`` and/or the setting ``MNEMOS_MCP_TOKENS`` (both are merged; one token may
not name two tenants). A token shorter than :data:`MIN_TOKEN_CHARS` characters is refused at start.
Only SHA-256 digests are kept, and :meth:`TokenTable.tenant_of` compares the digest of the presented
token with every known digest by :func:`hmac.compare_digest`, without stopping at a match, so the
time it takes does not depend on which token, or how much of one, matched.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from collections.abc import Mapping
from pathlib import Path

from mcp.server.auth.provider import AccessToken

from api.validation import Limits, check_tenant_id
from workers.runtime.errors import SettingsError
from workers.settings import Settings

log = logging.getLogger(__name__)

MIN_TOKEN_CHARS = 16


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


class TokenTable:
    """Token digests and the tenant each one names.

    Raises:
        SettingsError: for a token shorter than :data:`MIN_TOKEN_CHARS` or with whitespace, or a tenant
            id the service would refuse.
    """

    def __init__(self, tokens: Mapping[str, str], limits: Limits | None = None) -> None:
        checked = limits or Limits()
        self._entries: list[tuple[bytes, str]] = []
        for number, (token, tenant) in enumerate(tokens.items(), start=1):
            if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
                raise SettingsError(f"MCP token #{number} (of tenant {tenant!r}) must be at least {MIN_TOKEN_CHARS} "
                                    "characters without whitespace")
            try:
                tenant_id = check_tenant_id(tenant, "tenant", checked)
            except ValueError as exc:
                raise SettingsError(f"MCP token #{number} names an invalid tenant id: {exc}") from None
            self._entries.append((_digest(token), tenant_id))

    def __len__(self) -> int:
        return len(self._entries)

    def tenant_of(self, token: str) -> str | None:
        """The tenant ``token`` names, or None; compares against every entry (constant time per table)."""
        presented = _digest(token)
        found: str | None = None
        for digest, tenant in self._entries:
            if hmac.compare_digest(presented, digest):
                found = tenant
        return found

    @classmethod
    def from_settings(cls, settings: Settings) -> TokenTable:
        """The tokens of ``MNEMOS_MCP_TOKENS_FILE`` and ``MNEMOS_MCP_TOKENS`` together.

        Raises SettingsError when neither is set, the file cannot be read, a text is not a JSON object
        of strings, or one token names two tenants.
        """
        merged: dict[str, str] = {}
        sources = []
        if settings.mcp_tokens_file:
            path = Path(settings.mcp_tokens_file).expanduser()
            try:
                sources.append((f"MNEMOS_MCP_TOKENS_FILE ({path})", path.read_text(encoding="utf-8")))
                mode = path.stat().st_mode
            except OSError as exc:
                raise SettingsError(f"cannot read MNEMOS_MCP_TOKENS_FILE {path}: {exc.strerror or exc}") from None
            if mode & 0o077:  # the README's recipe is chmod 600: a token is a tenant's whole memory
                log.warning("MNEMOS_MCP_TOKENS_FILE %s can be read by other users (mode %o): chmod 600 it",
                            path, mode & 0o777)
        if settings.mcp_tokens:
            sources.append(("MNEMOS_MCP_TOKENS", settings.mcp_tokens))
        if not sources:
            raise SettingsError("the HTTP transport needs bearer tokens: set MNEMOS_MCP_TOKENS_FILE (or --tokens-file) "
                                'to a JSON file {"<token>": "<tenant>"} or MNEMOS_MCP_TOKENS to the same JSON')
        for source, text in sources:
            for token, tenant in _parse(source, text).items():
                if merged.get(token, tenant) != tenant:
                    raise SettingsError(f"{source}: a token names two tenants ({merged[token]!r} and {tenant!r})")
                merged[token] = tenant
        return cls(merged, Limits(max_id_chars=settings.max_id_chars))


def _parse(source: str, text: str) -> dict[str, str]:
    def refuse_repeats(pairs: list[tuple[str, object]]) -> dict[str, object]:
        # json.loads keeps the last of a repeated key: a token pasted twice would silently act for
        # the second tenant (found by a break-it session)
        seen: dict[str, object] = {}
        for key, item in pairs:
            if key in seen:
                raise SettingsError(f"{source}: a token appears twice ({_shown(key)}; names {seen[key]!r} and {item!r})")
            seen[key] = item
        return seen

    try:
        value = json.loads(text, object_pairs_hook=refuse_repeats)
    except ValueError as exc:
        raise SettingsError(f"{source} is not JSON: {exc}") from None
    if not isinstance(value, dict) or not value or not all(isinstance(k, str) and isinstance(v, str)
                                                           for k, v in value.items()):
        raise SettingsError(f'{source} must be a non-empty JSON object {{"<token>": "<tenant id>", ...}}')
    return value


class TenantTokenVerifier:
    """The SDK's ``TokenVerifier`` over a :class:`TokenTable`: a known token becomes an ``AccessToken``
    whose ``subject`` (and ``client_id``) is its tenant; any other token is refused (the SDK answers 401)."""

    def __init__(self, table: TokenTable) -> None:
        self.table = table

    async def verify_token(self, token: str) -> AccessToken | None:
        """The access of ``token`` (its tenant as subject and client id), or None for an unknown token."""
        tenant = self.table.tenant_of(token)
        if tenant is None:
            return None
        return AccessToken(token=token, client_id=tenant, scopes=[], subject=tenant)


def _shown(token: str) -> str:
    """A token as an error may show it: its first four characters only."""
    return f"{token[:4]}…" if len(token) > 4 else "a short token"
