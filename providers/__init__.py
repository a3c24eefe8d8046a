"""Model providers over HTTP: the OpenAI-compatible and Anthropic clients of the ModelClient
Protocol (core/agent/model.py), on aiohttp. Dependencies: gateway → providers → core; core
never imports this package (nor aiohttp)."""

from providers.anthropic import AnthropicClient
from providers.openai import OpenAIClient

__all__ = ["AnthropicClient", "OpenAIClient"]
