"""Typed keys for what the aiohttp application holds."""

from __future__ import annotations

from aiohttp import web

from channels.web import WebChat
from gateway.metrics import Metrics
from gateway.runtime import Runtime
from gateway.settings import Settings

__all__ = ["METRICS", "RUNTIME", "SETTINGS", "WEBCHAT"]

SETTINGS = web.AppKey("settings", Settings)
RUNTIME = web.AppKey("runtime", Runtime)
WEBCHAT = web.AppKey("webchat", WebChat)
METRICS = web.AppKey("metrics", Metrics)
