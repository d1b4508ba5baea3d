"""dashboards.guard: requests whose Host is not this machine (DNS rebinding) or whose Origin is another site
are refused before Streamlit sees them; plain ASGI scopes, no server."""

from __future__ import annotations

import asyncio

import pytest

from dashboards import guard

LOCAL = guard.allowed_hosts("127.0.0.1")


def _headers(**kw: str) -> list[tuple[bytes, bytes]]:
    return [(k.encode(), v.encode()) for k, v in kw.items()]


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1:8501", "localhost:8501", "[::1]:8501", "LOCALHOST:8501", "127.0.0.1"],
)
def test_local_hosts_pass(host: str) -> None:
    assert guard.check_request(_headers(host=host), LOCAL) is None


@pytest.mark.parametrize(
    "host",
    [
        "evil.example:8501",
        "evil.example",
        "127.0.0.1.evil.example:8501",
        "user@127.0.0.1:8501",
        "",
        "[::2]:8501",
    ],
)
def test_rebinding_hosts_are_refused(host: str) -> None:
    assert guard.check_request(_headers(host=host), LOCAL) is not None


def test_missing_host_is_refused() -> None:
    assert guard.check_request([], LOCAL) == "no Host header"


def test_origin_must_be_this_dashboard() -> None:
    ok = _headers(host="127.0.0.1:8501", origin="http://127.0.0.1:8501")
    assert guard.check_request(ok, LOCAL) is None
    for origin in ("http://evil.example:8501", "http://127.0.0.1:3000", "http://localhost:8501", "null"):
        assert guard.check_request(_headers(host="127.0.0.1:8501", origin=origin), LOCAL) is not None, origin


def test_a_proxy_host_given_with_allow_host_passes_with_its_https_origin() -> None:
    allowed = guard.allowed_hosts("0.0.0.0", ["dash.example.com"])
    assert "0.0.0.0" not in allowed and "dash.example.com" in allowed
    h = _headers(host="dash.example.com", origin="https://dash.example.com")
    assert guard.check_request(h, allowed) is None
    assert guard.check_request(_headers(host="dash.example.com"), LOCAL) is not None


def _call(scope_type: str, headers: list[tuple[bytes, bytes]]) -> tuple[list[dict], bool]:
    sent: list[dict] = []
    reached = []

    async def app(scope, receive, send):  # the wrapped app (Streamlit in production)
        reached.append(scope["type"])

    async def receive():
        return {}

    async def send(message):
        sent.append(message)

    mw = guard.HostOriginGuard(app, allowed=LOCAL)
    asyncio.run(mw({"type": scope_type, "headers": headers}, receive, send))
    return sent, bool(reached)


def test_middleware_answers_403_to_http_and_closes_websockets() -> None:
    sent, reached = _call("http", _headers(host="evil.example:8501"))
    assert not reached and sent[0]["status"] == 403 and b"refused" in sent[1]["body"]
    sent, reached = _call("websocket", _headers(host="127.0.0.1:8501", origin="http://evil.example"))
    assert not reached and sent == [{"type": "websocket.close", "code": 1008, "reason": sent[0]["reason"]}]
    sent, reached = _call("http", _headers(host="127.0.0.1:8501"))
    assert reached and not sent
    _, reached = _call("lifespan", [])
    assert reached


def test_allowed_hosts_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(guard.ALLOWED_HOSTS_ENV, "127.0.0.1,box.lan")
    assert guard.hosts_from_env() == ("127.0.0.1", "box.lan")
    monkeypatch.delenv(guard.ALLOWED_HOSTS_ENV)
    assert guard.hosts_from_env() == guard.LOCAL_HOSTS
