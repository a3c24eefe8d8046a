"""The web chat channel."""

from channels.web.adapter import WebChat, new_session_id, valid_session_id

__all__ = ["WebChat", "new_session_id", "valid_session_id"]
