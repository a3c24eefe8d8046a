"""The Slack channel: Events API webhook or Socket Mode in, mrkdwn and Block Kit out."""

from channels.base import ChannelContext
from channels.slack.adapter import SlackAdapter
from channels.slack.settings import SlackSettings

__all__ = ["SlackAdapter", "SlackSettings", "create"]


def create(section: SlackSettings, ctx: ChannelContext) -> SlackAdapter:
    """Build the adapter from its configuration section (no network call here)."""
    return SlackAdapter(section, ctx)
