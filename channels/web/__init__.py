"""The web chat channel."""

from channels.web.adapter import WebChat, conversation_of, new_secret, valid_secret

__all__ = ["WebChat", "conversation_of", "new_secret", "valid_secret"]
