"""The numbered text menus open per session (a reply with more choices than WhatsApp's buttons
shows them as a numbered list; a later "2" or a typed title picks one).

The store holds them, so they survive a restart and every replica sees them. Most sessions
never have one, so when this process is the store's only writer (no replicas to hear from:
SQLite) it also remembers, for recent sessions, what the store holds, and a text or a reply in
such a session costs no store read. The first look at a session reads the store.
"""

from __future__ import annotations

from cachetools import LRUCache

from channels.base import sole_writer_memory
from channels.whatsapp.outbound import Menu, menu_from_json, menu_to_json
from core.store import Store

__all__ = ["KNOWN_MAX", "NS_MENU", "Menus"]

NS_MENU = "whatsapp.menu"  # session → the numbered text menu last sent ("" once it is over)
KNOWN_MAX = 4096  # sessions whose menu (or its absence) is remembered here


class Menus:
    def __init__(self, store: Store) -> None:
        self._store = store
        # session → its menu as the store has it; None: others write too, always ask the store
        self._known: LRUCache[str, Menu] | None = sole_writer_memory(store, KNOWN_MAX)
        self._shown = 0  # counts show(): a store read that overlapped one is not remembered

    async def get(self, session: str) -> Menu:
        known = self._known
        if known is not None and session in known:
            return known[session]
        shown = self._shown
        menu = menu_from_json(await self._store.kv_get(NS_MENU, session))
        if shown == self._shown:
            self._remember(session, menu)
        return menu

    async def show(self, session: str, menu: Menu) -> None:
        """`menu` is the one the person now sees (empty: none, any earlier one is over)."""
        if menu:
            await self._store.kv_set(NS_MENU, session, menu_to_json(menu))
        elif await self.get(session):
            await self._store.kv_set(NS_MENU, session, "")
        else:
            return
        self._shown += 1
        self._remember(session, menu)

    def _remember(self, session: str, menu: Menu) -> None:
        if self._known is not None:
            self._known[session] = menu
